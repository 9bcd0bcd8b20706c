// A method decorator that wraps the handler (logging, tracing, metrics: `descriptor.value =
// function (...args) {...}`) leaves the function Nest calls with another `name` ('' here) than the
// method. The guard's key segment was `${class.name}.${handler.name}`, so two wrapped guarded
// methods of one controller shared keys: a refund with the client key of a charge was answered
// with the charge's saved response (the refund never ran). It is now the property name.
import { afterAll, beforeAll, describe, expect, it } from '@jest/globals';
import { Body, Controller, HttpCode, Post, Res } from '@nestjs/common';
type Response = { status(code: number): { json(body: unknown): void } };
import { randomUUID } from 'node:crypto';
import { NoRepeatSubmit } from '../libs/idempotency/src/index.js';
import { makeApp, replayed, send, type Adapter, type EdgeApp } from './support/edge-app.js';

/** A typical hand-written tracing decorator; keeps the metadata set below it. */
function Traced(): MethodDecorator {
  return (_target, _key, descriptor: PropertyDescriptor) => {
    const original = descriptor.value as (...args: unknown[]) => unknown;
    const wrapped = function (this: unknown, ...args: unknown[]) {
      return original.apply(this, args);
    };
    descriptor.value = [wrapped][0]; // an anonymous function (name ''), like `descriptor.value = function () {}`
    for (const key of Reflect.getMetadataKeys(original)) {
      Reflect.defineMetadata(key, Reflect.getMetadata(key, original), descriptor.value);
    }
    return descriptor;
  };
}

const runs: string[] = [];

@Controller('payments')
class PaymentsController {
  @Post('charge')
  @HttpCode(200)
  @NoRepeatSubmit()
  @Traced()
  charge(@Body() body: { amount: number }) {
    runs.push('charge');
    return { charged: body.amount };
  }

  @Post('refund')
  @HttpCode(200)
  @NoRepeatSubmit()
  @Traced()
  refund(@Body() body: { amount: number }) {
    runs.push('refund');
    return { refunded: body.amount };
  }
}

let webhookRuns = 0;

@Controller('hooks')
class HooksController {
  /** Answers through @Res(): the guard reads the route's param metadata by the function's name. */
  @Post()
  @NoRepeatSubmit()
  @Traced()
  receive(@Res() res: Response) {
    webhookRuns++;
    res.status(202).json({ accepted: true });
  }
}

describe('a wrapped @Res() handler (express)', () => {
  let app: EdgeApp;
  beforeAll(async () => {
    app = await makeApp('express', [HooksController]);
  });
  afterAll(() => app.close());

  it('has its own answer saved and replayed', async () => {
    const key = randomUUID();
    const first = await send(app.url, '/hooks', { key });
    const again = await send(app.url, '/hooks', { key });
    expect(first.status).toBe(202);
    // Observed: 409 IDEMPOTENCY_RESPONSE_NOT_REPLAYABLE (the reason `not_delivered`):
    // the route is not seen as an @Res() route, so the handler's own end() is taken as someone else's.
    expect({ runs: webhookRuns, status: again.status, replayed: replayed(again) }).toEqual({ runs: 1, status: 202, replayed: true });
  });
});

describe.each<Adapter>(['express', 'fastify'])('two wrapped guarded methods of one controller (%s)', (adapter) => {
  let app: EdgeApp;
  beforeAll(async () => {
    app = await makeApp(adapter, [PaymentsController]);
  });
  afterAll(() => app.close());

  it('keep their keys apart', async () => {
    const key = randomUUID();
    const charge = await send(app.url, '/payments/charge', { key, body: { amount: 5 } });
    const refund = await send(app.url, '/payments/refund', { key, body: { amount: 5 } });
    expect(JSON.parse(charge.text)).toEqual({ charged: 5 });
    // Observed: 422 IDEMPOTENCY_KEY_REUSED? or a replay of { charged: 5 }: refund never ran.
    expect({ status: refund.status, replayed: replayed(refund), body: refund.text }).toEqual({
      status: 200,
      replayed: false,
      body: JSON.stringify({ refunded: 5 }),
    });
  });
});
