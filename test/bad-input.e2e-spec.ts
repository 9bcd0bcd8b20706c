import { afterAll, beforeAll, describe, expect, it } from '@jest/globals';
import type { INestApplication } from '@nestjs/common';
import { randomUUID } from 'node:crypto';
import request from 'supertest';
import { DataSource } from 'typeorm';
import { createDemoApp, type HttpAdapterName } from '../apps/demo/src/demo-app.factory.js';
import { DATABASE_URL, REDIS_URL } from './support/services.js';

interface BadRequest {
  what: string;
  path?: string;
  method?: 'get' | 'post';
  contentType?: string;
  headers?: Record<string, string>;
  /** Sent as is: a string or Buffer is the raw body, anything else is JSON-encoded. */
  body?: string | Buffer | object;
  /** Expected status, or a set when the two adapters legitimately differ (same meaning). */
  status: number | number[];
  /** Expected `code`, or a set. */
  code: string | string[];
}

const orderNo = () => `BAD-${randomUUID().slice(0, 8)}`;
const json = (value: unknown) => JSON.stringify(value);
const deep = (levels: number) => '{"orderNo":"D-1","amount":1,"x":' + '{"a":'.repeat(levels) + '1' + '}'.repeat(levels) + '}';

/** At least 20 malformed or hostile requests: each gets a 4xx with a stable code and persists nothing. */
const cases: BadRequest[] = [
  { what: 'malformed JSON', body: '{"orderNo":', status: 400, code: 'INVALID_JSON' },
  { what: 'JSON with a trailing comma', body: '{"orderNo":"A-1","amount":1,}', status: 400, code: 'INVALID_JSON' },
  { what: 'text/plain body', contentType: 'text/plain', body: 'orderNo=A-1', status: 415, code: 'UNSUPPORTED_MEDIA_TYPE' },
  { what: 'XML body', contentType: 'application/xml', body: '<order><no>A-1</no></order>', status: 415, code: 'UNSUPPORTED_MEDIA_TYPE' },
  { what: 'a body over 1 MiB', body: json({ orderNo: orderNo(), amount: 1, pad: 'x'.repeat(1_100_000) }), status: 413, code: 'PAYLOAD_TOO_LARGE' },
  { what: 'no orderNo', body: json({ amount: 1 }), status: 400, code: 'IDEMPOTENCY_KEY_MISSING' },
  { what: 'an empty orderNo', body: json({ orderNo: '', amount: 1 }), status: 400, code: 'IDEMPOTENCY_KEY_INVALID' },
  { what: 'an orderNo of 300 characters', body: json({ orderNo: 'O'.repeat(300), amount: 1 }), status: 400, code: 'IDEMPOTENCY_KEY_INVALID' },
  { what: 'a control character in the orderNo', body: json({ orderNo: 'A\u0001B', amount: 1 }), status: 400, code: 'IDEMPOTENCY_KEY_INVALID' },
  { what: 'a lone surrogate in the orderNo', body: '{"orderNo":"A\\ud800B","amount":1}', status: 400, code: 'IDEMPOTENCY_KEY_INVALID' },
  { what: 'non-UTF-8 bytes in the orderNo', body: Buffer.from([...Buffer.from('{"orderNo":"A'), 0xff, 0xfe, ...Buffer.from('","amount":1}')]), status: 400, code: 'IDEMPOTENCY_KEY_INVALID' },
  { what: 'an orderNo with : { } * %', body: json({ orderNo: 'A:{b}*%2F', amount: 1 }), status: 400, code: 'VALIDATION_FAILED' },
  { what: 'an object as orderNo (operator injection)', body: json({ orderNo: { $gt: '' }, amount: 1 }), status: 400, code: 'IDEMPOTENCY_KEY_MISSING' },
  { what: 'a number as orderNo', body: json({ orderNo: 12345, amount: 1 }), status: 400, code: 'VALIDATION_FAILED' },
  { what: 'an amount as a string', body: json({ orderNo: orderNo(), amount: '12' }), status: 400, code: 'VALIDATION_FAILED' },
  { what: 'an amount beyond 2^53', body: `{"orderNo":"${orderNo()}","amount":9007199254740993}`, status: 400, code: 'VALIDATION_FAILED' },
  { what: 'an amount of 1e400 (Infinity)', body: `{"orderNo":"${orderNo()}","amount":1e400}`, status: 400, code: 'VALIDATION_FAILED' },
  { what: 'a negative amount', body: json({ orderNo: orderNo(), amount: -5 }), status: 400, code: 'VALIDATION_FAILED' },
  { what: 'an unknown field', body: json({ orderNo: orderNo(), amount: 1, admin: true }), status: 400, code: 'VALIDATION_FAILED' },
  { what: 'a __proto__ payload', body: `{"orderNo":"${orderNo()}","amount":1,"__proto__":{"admin":true}}`, status: 400, code: ['VALIDATION_FAILED', 'INVALID_JSON'] },
  { what: 'a constructor.prototype payload', body: `{"orderNo":"${orderNo()}","amount":1,"constructor":{"prototype":{"admin":true}}}`, status: 400, code: ['VALIDATION_FAILED', 'INVALID_JSON'] },
  { what: 'JSON nested 5,000 levels deep', body: deep(5000), status: 400, code: 'IDEMPOTENCY_PAYLOAD_UNSUPPORTED' },
  { what: 'a huge array', body: json({ orderNo: orderNo(), amount: 1, items: new Array(100_000).fill(0) }), status: 400, code: 'VALIDATION_FAILED' },
  { what: 'a JSON array as the body', body: '[{"orderNo":"A-1","amount":1}]', status: 400, code: ['IDEMPOTENCY_KEY_MISSING', 'VALIDATION_FAILED'] },
  { what: 'a JSON null body', body: 'null', status: 400, code: ['IDEMPOTENCY_KEY_MISSING', 'INVALID_JSON'] },
  { what: 'an empty JSON body', body: '', status: 400, code: ['IDEMPOTENCY_KEY_MISSING', 'INVALID_JSON'] },
  { what: 'a bad X-User-Id', headers: { 'x-user-id': 'a b' }, body: json({ orderNo: orderNo(), amount: 1 }), status: 400, code: 'INVALID_USER_ID' },
  { what: 'an X-User-Id of 200 characters', headers: { 'x-user-id': 'u'.repeat(200) }, body: json({ orderNo: orderNo(), amount: 1 }), status: 400, code: 'INVALID_USER_ID' },
  { what: 'a broken percent-encoding in the path', method: 'get', path: '/orders/%E0%A4%A', status: 400, code: ['BAD_REQUEST', 'FST_ERR_BAD_URL'] },
  { what: 'an unknown route', path: '/orders/x/y/z', body: json({}), status: 404, code: 'NOT_FOUND' },
];

describe.each<HttpAdapterName>(['express', 'fastify'])('bad input to the demo (%s)', (adapter) => {
  let app: INestApplication;
  let countOrders: () => Promise<number>;

  beforeAll(async () => {
    app = await createDemoApp({
      adapter,
      databaseUrl: DATABASE_URL,
      redisUrl: REDIS_URL,
      keyPrefix: `bad-input-${randomUUID()}`,
      logger: false,
    });
    const dataSource = app.get(DataSource);
    countOrders = async () => (await dataSource.query('select count(*)::int as n from orders'))[0].n;
  });
  afterAll(async () => app.close());

  it('has at least 20 cases', () => expect(cases.length).toBeGreaterThanOrEqual(20));

  it.each(cases)('$what → $status $code, nothing persisted', async (c) => {
    const before = await countOrders();
    const method = c.method ?? 'post';
    let req = request(app.getHttpServer())[method](c.path ?? '/orders').set('x-user-id', 'mallory');
    for (const [name, value] of Object.entries(c.headers ?? {})) req = req.set(name, value);
    if (method === 'post') {
      req = req.set('content-type', c.contentType ?? 'application/json');
      // Raw bytes as they are: superagent would JSON-encode a Buffer.
      req = Buffer.isBuffer(c.body) ? req.serialize(((body: Buffer) => body) as never).send(c.body as never) : req.send(c.body as string);
    }
    const res = await req;
    expect([c.status].flat()).toContain(res.status);
    expect([c.code].flat()).toContain(res.body.code);
    expect(await countOrders()).toBe(before);
  });
});
