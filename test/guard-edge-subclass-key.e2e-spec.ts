// A subclass's getKey() (README: "Your own user and key: subclassing the interceptor") returns
// what it reads from the request. An adversarial helper: whatever it returned was the key,
// unchecked: `${body.tenant}:${body.orderNo}` over missing fields gave every anonymous caller
// the one key `undefined:undefined` (10 clients with their own Idempotency-Key, 100 requests: 1
// run, and later callers got the first caller's answer), as did '', an object or a promise.
// The key a subclass gives is now checked as a key function's value is.
import { afterAll, beforeAll, describe, expect, it } from '@jest/globals';
import { Body, Controller, Injectable, Post, type ExecutionContext } from '@nestjs/common';
import { IdempotencyInterceptor, NoRepeatSubmit, type GuardedRoute, type IdempotencyModuleOptions } from 'nestjs-idempotency';
import { makeApp, send, type EdgeApp } from './support/edge-app.js';

let runs = 0;

@Controller('carts')
class CartsController {
  @Post()
  @NoRepeatSubmit()
  checkout(@Body() body: unknown) {
    runs++;
    return { run: runs, body };
  }
}

/** What the test asks getKey to return, by the request's `x-key-mode` header. */
const MODES: Record<string, (body: Record<string, unknown>) => unknown> = {
  template: (body) => `${body.tenant}:${body.orderNo}`,
  empty: () => '',
  long: () => 'x'.repeat(256),
  control: () => 'a\u0001b',
  object: (body) => ({ k: body.orderNo }),
  list: (body) => [body.orderNo, body.orderNo],
  nan: () => Number('abc'),
  promise: (body) => Promise.resolve(String(body.orderNo)),
  number: (body) => Number(body.orderNo),
};

@Injectable()
class TemplateKeyInterceptor extends IdempotencyInterceptor {
  protected override getKey(ctx: ExecutionContext, route: GuardedRoute): string | undefined {
    const req = ctx.switchToHttp().getRequest<{ headers: Record<string, string>; body: Record<string, unknown> }>();
    const mode = MODES[req.headers['x-key-mode'] ?? ''];
    return mode ? (mode(req.body ?? {}) as string) : super.getKey(ctx, route);
  }
}

/** The same, with getKey as a class field (an arrow function), set after the base class's constructor ran. */
@Injectable()
class FieldKeyInterceptor extends IdempotencyInterceptor {
  // @ts-expect-error TS2425: a method of the base class, redefined as a property (plain JS needs nothing)
  protected getKey = (ctx: ExecutionContext) => MODES[ctx.switchToHttp().getRequest<{ headers: Record<string, string> }>().headers['x-key-mode']]?.({});
}

describe('a subclass whose getKey is a class field', () => {
  let app: EdgeApp;
  beforeAll(async () => {
    app = await makeApp('express', [CartsController], { interceptor: FieldKeyInterceptor } as IdempotencyModuleOptions);
  });
  afterAll(async () => {
    await app?.close();
  });

  it.each(['template', 'empty', 'long', 'object'])('refuses the key of mode %s too', async (mode) => {
    const before = runs;
    const answer = await send(app.url, '/carts', { headers: { 'x-key-mode': mode }, body: {} });
    expect(answer.status).toBe(400);
    expect(runs).toBe(before);
  });
});

describe.each(['express', 'fastify'] as const)('a subclass whose getKey reads the request (%s)', (adapter) => {
  let app: EdgeApp;
  const post = (mode: string, body: object, key?: string) =>
    send(app.url, '/carts', { headers: { 'x-key-mode': mode }, body, key });

  beforeAll(async () => {
    app = await makeApp(adapter, [CartsController], { interceptor: TemplateKeyInterceptor } as IdempotencyModuleOptions);
  });
  afterAll(async () => {
    await app?.close();
  });

  it.each(['template', 'empty', 'long', 'control', 'object', 'list', 'nan'])('refuses the key of mode %s with 400 IDEMPOTENCY_KEY_INVALID, running nothing', async (mode) => {
    const before = runs;
    const answer = await post(mode, { cart: 'checkout' }, `client-${mode}`);
    expect({ status: answer.status, code: JSON.parse(answer.text).code }).toEqual({ status: 400, code: 'IDEMPOTENCY_KEY_INVALID' });
    expect(runs).toBe(before);
  });

  it('a promise (an async getKey) is the developer\'s mistake: 500, nothing runs', async () => {
    const before = runs;
    expect((await post('promise', { orderNo: 'p-1' })).status).toBe(500);
    expect(runs).toBe(before);
  });

  it('a number is its text; ten anonymous clients whose template names nothing never share one answer', async () => {
    const first = await post('number', { orderNo: 77 });
    expect(first.status).toBe(201);
    expect((await post('number', { orderNo: 77 })).headers['idempotent-replayed']).toBe('true');
    const before = runs;
    const answers = await Promise.all(Array.from({ length: 100 }, (_, i) => post('template', { cart: 'checkout' }, `client-${i % 10}`)));
    expect(answers.map((answer) => answer.status)).toEqual(Array(100).fill(400));
    expect(runs).toBe(before);
  });
});
