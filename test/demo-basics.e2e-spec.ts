import { afterAll, beforeAll, beforeEach, describe, expect, it } from '@jest/globals';
import type { INestApplication } from '@nestjs/common';
import { randomUUID } from 'node:crypto';
import request from 'supertest';
import { DataSource } from 'typeorm';
import { createDemoApp, type HttpAdapterName } from '../apps/demo/src/demo-app.factory.js';

const DATABASE_URL = process.env.DATABASE_URL ?? 'postgres://postgres@127.0.0.1:5432/test';
const UUID = /^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$/;

/** A fresh orderNo per test: the memory store outlives the TRUNCATE between tests. */
const newOrderNo = () => `ORD-${randomUUID().slice(0, 8)}`;

describe.each<HttpAdapterName>(['express', 'fastify'])('demo basics (%s)', (adapter) => {
  let app: INestApplication;
  let http: ReturnType<INestApplication['getHttpServer']>;

  beforeAll(async () => {
    try {
      app = await createDemoApp({
        adapter,
        databaseUrl: DATABASE_URL,
        keyPrefix: `basics-${adapter}-${randomUUID()}`,
        logger: ['error'],
      });
    } catch (error) {
      throw new Error(`Could not start the demo app against PostgreSQL at ${DATABASE_URL}`, { cause: error });
    }
    http = app.getHttpServer();
  });

  afterAll(async () => {
    await app?.close();
  });

  beforeEach(async () => {
    await app.get(DataSource).query('TRUNCATE orders');
  });

  const post = (body: unknown, userId?: string) => {
    const req = request(http).post('/orders');
    if (userId !== undefined) req.set('X-User-Id', userId);
    return req.send(body as object);
  };

  it('creates an order (201) and reads it back (200)', async () => {
    const orderNo = newOrderNo();
    const created = await post({ orderNo, amount: 12.5 }, 'alice').expect(201);
    expect(Object.keys(created.body).sort()).toEqual([
      'amount', 'createdAt', 'id', 'orderNo', 'paidAt', 'status', 'transactionId', 'userId',
    ]);
    expect(created.body).toMatchObject({
      orderNo, amount: 12.5, status: 'PENDING', userId: 'alice', transactionId: null, paidAt: null,
    });
    expect(created.body.id).toMatch(UUID);
    expect(new Date(created.body.createdAt).toISOString()).toBe(created.body.createdAt);

    const read = await request(http).get(`/orders/${orderNo}`).expect(200);
    expect(read.body).toEqual(created.body);
  });

  it('owns an order without X-User-Id by "anonymous"', async () => {
    const res = await post({ orderNo: newOrderNo(), amount: 1 }).expect(201);
    expect(res.body.userId).toBe('anonymous');
  });

  it('replays the first answer to a retry by the same user', async () => {
    const orderNo = newOrderNo();
    const first = await post({ orderNo, amount: 3 }, 'alice').expect(201);
    const retry = await post({ orderNo, amount: 3 }, 'alice').expect(201);
    expect(retry.body).toEqual(first.body);
    const [{ count }] = await app.get(DataSource).query('SELECT count(*)::int AS count FROM orders');
    expect(count).toBe(1);
  });

  it('answers 404 ORDER_NOT_FOUND for an unknown orderNo', async () => {
    const res = await request(http).get('/orders/NOPE-1').expect(404);
    expect(res.body).toMatchObject({ statusCode: 404, code: 'ORDER_NOT_FOUND' });
  });

  it('answers 409 ORDER_EXISTS, without the other order, when another user takes the orderNo', async () => {
    const orderNo = newOrderNo();
    await post({ orderNo, amount: 10 }, 'alice').expect(201);
    const res = await post({ orderNo, amount: 99 }, 'bob').expect(409);
    expect(res.body).toEqual({
      statusCode: 409,
      error: 'Conflict',
      code: 'ORDER_EXISTS',
      message: 'An order with this orderNo already exists.',
    });
  });

  it('creates one order when users race for one orderNo', async () => {
    const orderNo = newOrderNo();
    const users = ['u1', 'u2', 'u3', 'u4', 'u5'];
    const answers = await Promise.all(users.map((user) => post({ orderNo, amount: 1 }, user)));
    expect(answers.map((a) => a.status).sort()).toEqual([201, 409, 409, 409, 409]);
    const [{ count }] = await app.get(DataSource).query('SELECT count(*)::int AS count FROM orders');
    expect(count).toBe(1);
  });

  it.each([
    ['a negative amount', { amount: -1 }],
    ['an amount with 3 decimals', { amount: 1.234 }],
    ['an amount over 1e9', { amount: 1e9 + 1 }],
    ['an amount as a string', { amount: '5' }],
    ['an unknown property', { amount: 5, extra: true }],
    ['an orderNo with a space', { orderNo: 'A B', amount: 5 }],
  ])('answers 400 VALIDATION_FAILED for %s', async (_name, patch) => {
    const res = await post({ orderNo: newOrderNo(), ...patch }, 'alice').expect(400);
    expect(res.body).toMatchObject({ statusCode: 400, error: 'Bad Request', code: 'VALIDATION_FAILED' });
    expect(Array.isArray(res.body.message)).toBe(true);
  });

  it.each([
    ['an amount as a string', { amount: '12' }, ['amount must be a number conforming to the specified constraints']],
    ['a negative amount', { amount: -1 }, ['amount must not be less than 0.01']],
    ['no amount and a bad orderNo', { orderNo: 'A B' }, ['orderNo may only contain letters, digits and _ . : -', 'amount must be a number conforming to the specified constraints']],
  ])('answers one message per field for %s, the most basic one first', async (_name, patch, messages) => {
    const res = await post({ orderNo: newOrderNo(), ...patch }, 'alice').expect(400);
    expect(res.body.message).toEqual(messages);
  });

  it.each([
    ['a __proto__ key', '{"orderNo":"P-1","amount":1,"__proto__":{"admin":true}}'],
    ['a nested constructor.prototype', '{"orderNo":"P-1","amount":1,"x":[{"constructor":{"prototype":{"admin":true}}}]}'],
  ])('answers 400 INVALID_JSON for a body with %s, and creates nothing', async (_what, body) => {
    const res = await request(http).post('/orders').set('Content-Type', 'application/json').send(body);
    expect([res.status, res.body.code]).toEqual([400, 'INVALID_JSON']);
    const [{ count }] = await app.get(DataSource).query('SELECT count(*)::int AS count FROM orders');
    expect(count).toBe(0);
  });

  it('answers 413 PAYLOAD_TOO_COMPLEX, not a 5xx, for an array of 480,000 items just under 1 MiB', async () => {
    const res = await post({ orderNo: newOrderNo(), amount: 1, items: new Array(480_000).fill(0) });
    expect([res.status, res.body.code]).toEqual([413, 'PAYLOAD_TOO_COMPLEX']);
  });

  it('answers 400 INVALID_JSON for malformed JSON', async () => {
    const res = await request(http)
      .post('/orders')
      .set('Content-Type', 'application/json')
      .send('{"orderNo": "A-1", "amount": ')
      .expect(400);
    expect(res.body).toEqual({
      statusCode: 400,
      error: 'Bad Request',
      code: 'INVALID_JSON',
      message: 'The request body is not valid JSON.',
    });
  });

  it('answers a 400 with a code for an empty JSON body', async () => {
    const res = await request(http).post('/orders').set('Content-Type', 'application/json').send('').expect(400);
    expect(typeof res.body.code).toBe('string');
  });

  it('accepts a body just under 1 MiB and answers 413 PAYLOAD_TOO_LARGE above it', async () => {
    const under = await post({ orderNo: newOrderNo(), amount: 1, pad: 'x'.repeat(1000 * 1000) }).expect(400);
    expect(under.body.code).toBe('VALIDATION_FAILED');
    const res = await post({ orderNo: newOrderNo(), amount: 1, pad: 'x'.repeat(1024 * 1024) }).expect(413);
    expect(res.body).toMatchObject({ statusCode: 413, error: 'Payload Too Large', code: 'PAYLOAD_TOO_LARGE' });
  });

  it.each([
    ['text/plain', 'orderNo=A-1 amount=5'],
    ['application/x-www-form-urlencoded', 'orderNo=A-1&amount=5'],
    ['application/xml', '<order><orderNo>A-1</orderNo></order>'],
  ])('answers 415 UNSUPPORTED_MEDIA_TYPE for a %s body', async (contentType, body) => {
    const res = await request(http).post('/orders').set('Content-Type', contentType).send(body).expect(415);
    expect(res.body).toMatchObject({ statusCode: 415, code: 'UNSUPPORTED_MEDIA_TYPE' });
  });

  it.each([['a b'], ['x'.repeat(65)], ['  ']])('answers 400 INVALID_USER_ID for X-User-Id %j', async (userId) => {
    const res = await post({ orderNo: newOrderNo(), amount: 1 }, userId).expect(400);
    expect(res.body).toMatchObject({ statusCode: 400, code: 'INVALID_USER_ID' });
  });

  it('answers 404 NOT_FOUND for an unknown route', async () => {
    const res = await request(http).get('/nowhere').expect(404);
    expect(res.body).toMatchObject({ statusCode: 404, code: 'NOT_FOUND' });
  });
});
