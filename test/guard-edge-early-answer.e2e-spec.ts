// A webhook-style @Res() handler that acknowledges at once and keeps working (the sender wants a
// 2xx within a few seconds): the acknowledgement must reach the sender before the work ends (the
// guard once held the finished answer until the handler's promise settled).
import { afterAll, beforeAll, describe, expect, it } from '@jest/globals';
import { Controller, Post, Res } from '@nestjs/common';
import { randomUUID } from 'node:crypto';
import { NoRepeatSubmit } from '../libs/idempotency/src/index.js';
import { makeApp, send, sleep, type Adapter, type EdgeApp } from './support/edge-app.js';

let finished = false;

type Reply = { status(code: number): { json?(v: unknown): void; send(v: unknown): void } };

@Controller('webhooks')
class WebhookController {
  @Post('stripe')
  @NoRepeatSubmit()
  async stripe(@Res() res: Reply) {
    const r = res.status(202);
    if (r.json) r.json({ received: true });
    else r.send({ received: true });
    await sleep(4000); // processes the event after acknowledging it (long: a loaded CI machine is slow to answer)
    finished = true;
  }
}

describe.each<Adapter>(['express', 'fastify'])('an @Res() handler that answers, then keeps working (%s)', (adapter) => {
  let a: EdgeApp;
  beforeAll(async () => {
    a = await makeApp(adapter, [WebhookController]);
  });
  afterAll(async () => a?.close());

  it('gets its answer to the client before the work ends', async () => {
    finished = false;
    const ack = await send(a.url, '/webhooks/stripe', { key: randomUUID() });
    expect({ status: ack.status, workFinished: finished }).toEqual({ status: 202, workFinished: false });
  });
});
