// ignoreFields removes fields of the body and the query. The route's path and host parameters
// are the route itself, and the query is not a field: a name in ignoreFields that is also a path
// parameter (`id`), or `query` / `params`, must not make another account's call, or another
// page, the same request.
import { afterAll, beforeAll, describe, expect, it } from '@jest/globals';
import { Body, Controller, Param, Post } from '@nestjs/common';
import { randomUUID } from 'node:crypto';
import { NoRepeatSubmit } from '../libs/idempotency/src/index.js';
import { codeOf, makeApp, replayed, send, type Adapter, type EdgeApp } from './support/edge-app.js';

let runs = 0;

@Controller('accounts')
class PaymentsController {
  @Post(':id/pay')
  @NoRepeatSubmit({ ignoreFields: ['id', 'query', 'params', 'hosts', 'requestedAt'] })
  pay(@Param('id') id: string, @Body() body: unknown) {
    runs++;
    return { account: id, body, run: runs };
  }
}

describe.each<Adapter>(['express', 'fastify'])('ignoreFields and the route (%s)', (adapter) => {
  let a: EdgeApp;
  beforeAll(async () => {
    a = await makeApp(adapter, [PaymentsController]);
  });
  afterAll(async () => a?.close());

  it('another account under the same key is another request (422), not the first account\'s replay', async () => {
    const key = randomUUID();
    const first = await send(a.url, '/accounts/1/pay', { key, body: { amount: 5 } });
    const other = await send(a.url, '/accounts/2/pay', { key, body: { amount: 5 } });
    expect(first.status).toBe(201);
    expect({ status: other.status, code: codeOf(other), replayed: replayed(other) }).toEqual({
      status: 422,
      code: 'IDEMPOTENCY_KEY_REUSED',
      replayed: false,
    });
  });

  it('another query under the same key is another request (422)', async () => {
    const key = randomUUID();
    await send(a.url, '/accounts/1/pay?page=1', { key, body: { amount: 5 } });
    const other = await send(a.url, '/accounts/1/pay?page=2', { key, body: { amount: 5 } });
    expect({ status: other.status, replayed: replayed(other) }).toEqual({ status: 422, replayed: false });
  });

  it('(control) the named fields of the body are still ignored', async () => {
    const key = randomUUID();
    const first = await send(a.url, '/accounts/1/pay', { key, body: { amount: 5, id: 'a', requestedAt: 't1' } });
    const retry = await send(a.url, '/accounts/1/pay', { key, body: { amount: 5, id: 'b', requestedAt: 't2' } });
    expect({ replayed: replayed(retry), body: retry.text }).toEqual({ replayed: true, body: first.text });
  });
});
