// A webhook-style @Res() handler that acknowledges at once and keeps working (the sender wants a
// 2xx within a few seconds): the acknowledgement must reach the sender before the work ends (the
// guard once held the finished answer until the handler's promise settled).
import { afterAll, beforeAll, describe, expect, it } from '@jest/globals';
import { Controller, Post, Res } from '@nestjs/common';
import { randomUUID } from 'node:crypto';
import { NoRepeatSubmit } from '../libs/idempotency/src/index.js';
import { makeApp, send, type Adapter, type EdgeApp } from './support/edge-app.js';

let finished = false;
// The work waits for the test to have read the acknowledgement (a fixed sleep raced a loaded CI
// machine's answer); 20 s at most, so a guard that holds the answer until the handler ends still
// answers, with the work finished, inside the test's 30 s.
let endWork: () => void = () => undefined;
const workGate = () => new Promise<void>((resolve) => {
  endWork = resolve;
  setTimeout(resolve, 20_000).unref();
});

type Reply = { status(code: number): { json?(v: unknown): void; send(v: unknown): void } };

@Controller('webhooks')
class WebhookController {
  @Post('stripe')
  @NoRepeatSubmit()
  async stripe(@Res() res: Reply) {
    const r = res.status(202);
    if (r.json) r.json({ received: true });
    else r.send({ received: true });
    await workGate(); // processes the event after acknowledging it
    finished = true;
  }
}

describe.each<Adapter>(['express', 'fastify'])('an @Res() handler that answers, then keeps working (%s)', (adapter) => {
  let a: EdgeApp;
  beforeAll(async () => {
    a = await makeApp(adapter, [WebhookController]);
  });
  afterAll(async () => {
    endWork();
    await a?.close();
  });

  it('gets its answer to the client before the work ends', async () => {
    finished = false;
    const ack = await send(a.url, '/webhooks/stripe', { key: randomUUID() });
    const workFinished = finished;
    endWork();
    expect({ status: ack.status, workFinished }).toEqual({ status: 202, workFinished: false });
  });
});
