import { afterAll, beforeAll, describe, expect, it } from '@jest/globals';
import type { INestApplication } from '@nestjs/common';
import { randomUUID } from 'node:crypto';
import request from 'supertest';
import { DataSource } from 'typeorm';
import type { HttpAdapterName } from '../apps/demo/src/demo-app.factory.js';
import { listenDemo, postJson } from './support/demo-server.js';
import { DATABASE_URL } from './support/services.js';

/**
 * The payment provider's callback and the cancel action: idempotent by one conditional UPDATE
 * (`transition`), no guard in front. Repeats change nothing and get the order as the first left it.
 */
describe.each<HttpAdapterName>(['express', 'fastify'])('payment callback and cancel (%s)', (adapter) => {
  let app: INestApplication;
  let baseUrl: string;
  const http = () => request(app.getHttpServer());

  beforeAll(async () => {
    ({ app, baseUrl } = await listenDemo({ adapter, databaseUrl: DATABASE_URL, keyPrefix: `callback-${randomUUID()}` }));
  });
  afterAll(async () => app?.close());

  const newOrder = async (): Promise<string> => {
    const orderNo = `PAY-${randomUUID()}`;
    await http().post('/orders').set('X-User-Id', 'alice').send({ orderNo, amount: 20 }).expect(201);
    return orderNo;
  };
  const pay = (orderNo: string, body: object) => http().post(`/orders/${orderNo}/payment-callback`).send(body);
  const cancel = (orderNo: string) => http().post(`/orders/${orderNo}/cancel`);
  const row = async (orderNo: string) =>
    (
      await app
        .get(DataSource)
        .query('select status, transaction_id, paid_at, version from orders where order_no = $1', [orderNo])
    )[0];

  it('pays a PENDING order once: a repeat, with any transaction id, answers the first payment', async () => {
    const orderNo = await newOrder();
    const first = await pay(orderNo, { transactionId: 'tx-first', paidAt: '2026-11-30T10:15:00+02:00' });
    expect(first.status).toBe(200);
    expect(first.body).toMatchObject({
      changed: true,
      order: { orderNo, status: 'PAID', transactionId: 'tx-first', paidAt: '2026-11-30T08:15:00.000Z' },
    });

    const repeat = await pay(orderNo, { transactionId: 'tx-second', paidAt: '2026-12-01T00:00:00Z' });
    expect(repeat.status).toBe(200);
    expect(repeat.body).toEqual({ changed: false, order: first.body.order });

    const read = await http().get(`/orders/${orderNo}`).expect(200);
    expect(read.body).toEqual(first.body.order);
    expect(read.body).toMatchObject({ status: 'PAID', transactionId: 'tx-first', paidAt: '2026-11-30T08:15:00.000Z' });
    expect((await row(orderNo)).version).toBe(2);
  });

  it('lets exactly one of 20 concurrent callbacks pay the order, and keeps its transaction id', async () => {
    const orderNo = await newOrder();
    const answers = await Promise.all(
      Array.from({ length: 20 }, (_, i) =>
        postJson<{ changed: boolean; order: { transactionId: string } }>(`${baseUrl}/orders/${orderNo}/payment-callback`, {
          transactionId: `tx-${i}`,
          paidAt: new Date(Date.UTC(2026, 10, 30, 12, 0, i)).toISOString(),
        }),
      ),
    );
    expect(answers.map((answer) => answer.status)).toEqual(Array(20).fill(200));
    const winners = answers.filter((answer) => answer.body.changed);
    expect(winners).toHaveLength(1);
    const winner = winners[0].body.order;
    for (const answer of answers) expect(answer.body.order).toEqual(winner);

    const stored = await row(orderNo);
    expect(stored.transaction_id).toBe(winner.transactionId);
    expect(stored.version).toBe(2);
  });

  it('answers 404 ORDER_NOT_FOUND for an unknown order', async () => {
    const res = await pay(`NOPE-${randomUUID()}`, { transactionId: 'tx', paidAt: '2026-11-30T10:00:00Z' });
    expect(res.status).toBe(404);
    expect(res.body).toMatchObject({ statusCode: 404, code: 'ORDER_NOT_FOUND' });
    const cancelled = await cancel(`NOPE-${randomUUID()}`);
    expect([cancelled.status, cancelled.body.code]).toEqual([404, 'ORDER_NOT_FOUND']);
  });

  it('cancels a PENDING order once, then refuses to pay it with 409 ORDER_NOT_PAYABLE', async () => {
    const orderNo = await newOrder();
    const first = await cancel(orderNo);
    expect(first.status).toBe(200);
    expect(first.body).toMatchObject({ changed: true, order: { orderNo, status: 'CANCELLED', transactionId: null, paidAt: null } });
    const repeat = await cancel(orderNo);
    expect(repeat.status).toBe(200);
    expect(repeat.body).toEqual({ changed: false, order: first.body.order });

    const res = await pay(orderNo, { transactionId: 'tx-late', paidAt: '2026-11-30T10:00:00Z' });
    expect(res.status).toBe(409);
    expect(res.body).toMatchObject({ statusCode: 409, code: 'ORDER_NOT_PAYABLE', status: 'CANCELLED' });
    expect(await row(orderNo)).toMatchObject({ status: 'CANCELLED', transaction_id: null, paid_at: null, version: 2 });
  });

  it('refuses to cancel a PAID order with 409 ORDER_NOT_CANCELLABLE', async () => {
    const orderNo = await newOrder();
    await pay(orderNo, { transactionId: 'tx-1', paidAt: '2026-11-30T10:00:00Z' }).expect(200);
    const res = await cancel(orderNo);
    expect(res.status).toBe(409);
    expect(res.body).toMatchObject({ statusCode: 409, code: 'ORDER_NOT_CANCELLABLE', status: 'PAID' });
    expect((await row(orderNo)).status).toBe('PAID');
  });

  // A transaction id of 128 characters (the column's width) is tested in demo-migrations, on
  // databases of its own: here the shared database may hold a table an older checkout synchronized.

  it.each([
    ['no transactionId', { paidAt: '2026-11-30T10:00:00Z' }],
    ['an empty transactionId', { transactionId: '', paidAt: '2026-11-30T10:00:00Z' }],
    ['a transactionId of 129 characters', { transactionId: 'T'.repeat(129), paidAt: '2026-11-30T10:00:00Z' }],
    ['a numeric transactionId', { transactionId: 42, paidAt: '2026-11-30T10:00:00Z' }],
    // PostgreSQL refuses a NUL ("invalid byte sequence"): a 500 before it was validated.
    ['a NUL in the transactionId', { transactionId: 'a\u0000b', paidAt: '2026-11-30T10:00:00Z' }],
    // Not UTF-8: the driver would have stored U+FFFD in its place.
    ['an unpaired surrogate in the transactionId', { transactionId: 'a\ud800b', paidAt: '2026-11-30T10:00:00Z' }],
    ['no paidAt', { transactionId: 'tx' }],
    ['a paidAt that is not a date', { transactionId: 'tx', paidAt: 'yesterday' }],
    ['an impossible paidAt', { transactionId: 'tx', paidAt: '2026-02-30T10:00:00Z' }],
    ['an unknown property', { transactionId: 'tx', paidAt: '2026-11-30T10:00:00Z', status: 'PAID' }],
  ])('answers 400 VALIDATION_FAILED for %s and changes nothing', async (_what, body) => {
    const orderNo = await newOrder();
    const res = await pay(orderNo, body);
    expect(res.status).toBe(400);
    expect(res.body).toMatchObject({ statusCode: 400, code: 'VALIDATION_FAILED' });
    expect(await row(orderNo)).toMatchObject({ status: 'PENDING', transaction_id: null, version: 1 });
  });
});
