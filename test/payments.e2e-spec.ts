// The demo's POST /payments in the transactional mode (IdempotentTransactions on PostgreSQL): the
// payment row, the idempotency record and the answer commit in one transaction. Real parallel
// requests on both adapters; `GET /orders/:orderNo/payments` counts what was recorded.
import { afterAll, beforeAll, describe, expect, it } from '@jest/globals';
import type { INestApplication } from '@nestjs/common';
import { randomUUID } from 'node:crypto';
import request from 'supertest';
import { createDemoApp, type HttpAdapterName } from '../apps/demo/src/demo-app.factory.js';
import { DATABASE_URL } from './support/services.js';

describe.each<HttpAdapterName>(['express', 'fastify'])('demo payments, transactional (%s)', (adapter) => {
  let app: INestApplication;
  const http = () => request(app.getHttpServer());
  const pay = (key: string | string[] | undefined, body: object, user = 'alice') => {
    const req = http().post('/payments').set('X-User-Id', user);
    // An array goes out as one header line per key (superagent's typings know that of Cookie only).
    if (key !== undefined) req.set('Idempotency-Key', key as string);
    return req.send(body);
  };
  const paymentsOf = async (orderNo: string) => (await http().get(`/orders/${orderNo}/payments`).expect(200)).body as { id: string }[];
  const newOrder = async () => {
    const orderNo = `PAY-${randomUUID()}`;
    await http().post('/orders').set('X-User-Id', 'alice').send({ orderNo, amount: 40 }).expect(201);
    return orderNo;
  };

  beforeAll(async () => {
    app = await createDemoApp({ adapter, databaseUrl: DATABASE_URL, keyPrefix: `payments-${adapter}-${randomUUID()}`, logger: ['error'] });
  });
  afterAll(async () => {
    await app?.close();
  });

  it('records one payment for 50 parallel requests with one key; every 201 names it, a retry replays it', async () => {
    const orderNo = await newOrder();
    const key = randomUUID();
    const answers = await Promise.all(Array.from({ length: 50 }, () => pay(key, { orderNo, amount: 40 })));
    const statuses = answers.map((answer) => answer.status);
    expect(statuses.filter((status) => status !== 201 && status !== 409)).toEqual([]);
    const ids = new Set(answers.filter((answer) => answer.status === 201).map((answer) => answer.body.id));
    expect(ids.size).toBe(1);
    for (const refused of answers.filter((answer) => answer.status === 409)) expect(refused.body.code).toBe('IDEMPOTENCY_IN_PROGRESS');

    const payments = await paymentsOf(orderNo);
    expect(payments).toHaveLength(1);
    expect(ids).toEqual(new Set([payments[0].id]));
    const retry = await pay(key, { orderNo, amount: 40 }).expect(201);
    expect(retry.headers['idempotent-replayed']).toBe('true');
    expect(retry.body).toMatchObject({ id: payments[0].id, orderNo, amount: 40, userId: 'alice' });
    expect(await paymentsOf(orderNo)).toHaveLength(1);
  });

  it('answers 422 for the key with another body, pays again with a new key, and keeps users apart', async () => {
    const orderNo = await newOrder();
    const key = randomUUID();
    const first = await pay(key, { orderNo, amount: 10 }).expect(201);
    expect((await pay(key, { orderNo, amount: 11 }).expect(422)).body.code).toBe('IDEMPOTENCY_KEY_REUSED');
    const second = await pay(randomUUID(), { orderNo, amount: 10 }).expect(201);
    const bob = await pay(key, { orderNo, amount: 10 }, 'bob').expect(201); // bob's key is bob's
    expect(new Set([first.body.id, second.body.id, bob.body.id]).size).toBe(3);
    expect(await paymentsOf(orderNo)).toHaveLength(3);
  });

  it('refuses a missing or invalid key with the guard\'s codes, and records nothing for an unknown order', async () => {
    const orderNo = await newOrder();
    expect((await pay(undefined, { orderNo, amount: 5 }).expect(400)).body.code).toBe('IDEMPOTENCY_KEY_MISSING');
    expect((await pay('', { orderNo, amount: 5 }).expect(400)).body.code).toBe('IDEMPOTENCY_KEY_INVALID');
    // helper-211: the demo read the header Node had joined (`K, K`): a key of its own, so the
    // operation's retry with `K` paid a second time.
    const key2 = randomUUID();
    expect((await pay([key2, key2], { orderNo, amount: 5 }).expect(400)).body).toMatchObject({ code: 'IDEMPOTENCY_KEY_INVALID', message: expect.stringMatching(/more than once/) });
    expect(await paymentsOf(orderNo)).toEqual([]);
    const unknown = `PAY-${randomUUID()}`;
    const key = randomUUID();
    expect((await pay(key, { orderNo: unknown, amount: 5 }).expect(404)).body.code).toBe('ORDER_NOT_FOUND');
    expect(await paymentsOf(unknown)).toEqual([]);
    // Nothing was recorded: once the order exists, the same key pays.
    await http().post('/orders').set('X-User-Id', 'alice').send({ orderNo: unknown, amount: 5 }).expect(201);
    expect((await pay(key, { orderNo: unknown, amount: 5 }).expect(201)).headers['idempotent-replayed']).toBeUndefined();
    expect(await paymentsOf(unknown)).toHaveLength(1);
  });
});
