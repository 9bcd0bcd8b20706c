import { afterAll, beforeAll, describe, expect, it } from '@jest/globals';
import type { ArgumentsHost, INestApplication } from '@nestjs/common';
import type { HttpAdapterHost } from '@nestjs/core';
import { randomUUID } from 'node:crypto';
import { gzipSync } from 'node:zlib';
import request from 'supertest';
import { DataSource } from 'typeorm';
import { BODY_LIMIT_BYTES, createDemoApp, type HttpAdapterName } from '../apps/demo/src/demo-app.factory.js';
import { DemoExceptionFilter } from '../apps/demo/src/demo-exception.filter.js';
import { DATABASE_URL, REDIS_URL } from './support/services.js';

interface BadRequest {
  what: string;
  /** Default `/orders`; `:pending` stands for the orderNo of a PENDING order made for the run. */
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
  /** What the answer's message must say: the validator's words, where the database's backstop gives the same code. */
  message?: RegExp;
}

const orderNo = () => `BAD-${randomUUID().slice(0, 8)}`;
const json = (value: unknown) => JSON.stringify(value);
const deep = (levels: number, fields = '"orderNo":"D-1","amount":1') => `{${fields},"x":` + '{"a":'.repeat(levels) + '1' + '}'.repeat(levels) + '}';
/** `{<fields>,"k0":0,"k1":0,...}`: as many unknown keys as fit in the 1 MiB body limit (~95,000). */
const manyKeys = (fields: string) => {
  const parts = [`{${fields}`];
  let bytes = parts[0]!.length + 1;
  for (let i = 0; bytes + 12 < BODY_LIMIT_BYTES; i++) {
    const part = `,"k${i}":0`;
    parts.push(part);
    bytes += part.length;
  }
  return `${parts.join('')}}`;
};
const CALLBACK = '"transactionId":"tx-1","paidAt":"2026-11-30T10:00:00Z"';
const callback = (fields: object) => json({ transactionId: 'tx-1', paidAt: '2026-11-30T10:00:00Z', ...fields });
const invoiceHeaders = () => ({ 'x-idempotency-token': randomUUID() });

/** At least 20 malformed or hostile requests: each gets a 4xx with a stable code and persists nothing. */
const cases: BadRequest[] = [
  { what: 'malformed JSON', body: '{"orderNo":', status: 400, code: 'INVALID_JSON' },
  { what: 'JSON with a trailing comma', body: '{"orderNo":"A-1","amount":1,}', status: 400, code: 'INVALID_JSON' },
  { what: 'text/plain body', contentType: 'text/plain', body: 'orderNo=A-1', status: 415, code: 'UNSUPPORTED_MEDIA_TYPE' },
  { what: 'XML body', contentType: 'application/xml', body: '<order><no>A-1</no></order>', status: 415, code: 'UNSUPPORTED_MEDIA_TYPE' },
  { what: 'a body over 1 MiB', body: json({ orderNo: orderNo(), amount: 1, pad: 'x'.repeat(1_100_000) }), status: 413, code: 'PAYLOAD_TOO_LARGE' },
  { what: 'no orderNo', body: json({ amount: 1 }), status: 400, code: 'IDEMPOTENCY_KEY_MISSING' },
  { what: 'an empty orderNo', body: json({ orderNo: '', amount: 1 }), status: 400, code: 'IDEMPOTENCY_KEY_INVALID' },
  // helper-195: a header of spaces was refused as empty, a body field of them keyed every blank order alike.
  { what: 'an orderNo of spaces', body: json({ orderNo: ' \u00a0 ', amount: 1 }), status: 400, code: 'IDEMPOTENCY_KEY_INVALID' },
  // A zero-width space looks as blank: every such order of a user was one record.
  { what: 'an orderNo of zero-width spaces', body: json({ orderNo: '\u200b\u200b', amount: 1 }), status: 400, code: 'IDEMPOTENCY_KEY_INVALID' },
  { what: 'an orderNo of 300 characters', body: json({ orderNo: 'O'.repeat(300), amount: 1 }), status: 400, code: 'IDEMPOTENCY_KEY_INVALID' },
  { what: 'a control character in the orderNo', body: json({ orderNo: 'A\u0001B', amount: 1 }), status: 400, code: 'IDEMPOTENCY_KEY_INVALID' },
  { what: 'a lone surrogate in the orderNo', body: '{"orderNo":"A\\ud800B","amount":1}', status: 400, code: 'IDEMPOTENCY_KEY_INVALID' },
  { what: 'non-UTF-8 bytes in the orderNo', body: Buffer.from([...Buffer.from('{"orderNo":"A'), 0xff, 0xfe, ...Buffer.from('","amount":1}')]), status: 400, code: 'IDEMPOTENCY_KEY_INVALID' },
  { what: 'an orderNo with : { } * %', body: json({ orderNo: 'A:{b}*%2F', amount: 1 }), status: 400, code: 'VALIDATION_FAILED' },
  { what: 'an object as orderNo (operator injection)', body: json({ orderNo: { $gt: '' }, amount: 1 }), status: 400, code: 'IDEMPOTENCY_KEY_INVALID' },
  { what: 'a number as orderNo', body: json({ orderNo: 12345, amount: 1 }), status: 400, code: 'VALIDATION_FAILED' },
  { what: 'an amount as a string', body: json({ orderNo: orderNo(), amount: '12' }), status: 400, code: 'VALIDATION_FAILED' },
  { what: 'an amount beyond 2^53', body: `{"orderNo":"${orderNo()}","amount":9007199254740993}`, status: 400, code: 'VALIDATION_FAILED' },
  { what: 'an amount of 1e400 (Infinity)', body: `{"orderNo":"${orderNo()}","amount":1e400}`, status: 400, code: 'VALIDATION_FAILED' },
  { what: 'a negative amount', body: json({ orderNo: orderNo(), amount: -5 }), status: 400, code: 'VALIDATION_FAILED' },
  { what: 'an unknown field', body: json({ orderNo: orderNo(), amount: 1, admin: true }), status: 400, code: 'VALIDATION_FAILED' },
  { what: 'a __proto__ payload', body: `{"orderNo":"${orderNo()}","amount":1,"__proto__":{"admin":true}}`, status: 400, code: ['VALIDATION_FAILED', 'INVALID_JSON'] },
  { what: 'a constructor.prototype payload', body: `{"orderNo":"${orderNo()}","amount":1,"constructor":{"prototype":{"admin":true}}}`, status: 400, code: ['VALIDATION_FAILED', 'INVALID_JSON'] },
  { what: 'JSON nested 5,000 levels deep', body: deep(5000), status: 413, code: 'PAYLOAD_TOO_COMPLEX' },
  { what: 'a huge array', body: json({ orderNo: orderNo(), amount: 1, items: new Array(100_000).fill(0) }), status: 413, code: 'PAYLOAD_TOO_COMPLEX' },
  // class-transformer's transform is quadratic in the keys of an object: refused before it runs.
  { what: '~95,000 unknown keys in 1 MiB', body: manyKeys(`"orderNo":"${orderNo()}","amount":1`), status: 413, code: 'PAYLOAD_TOO_COMPLEX' },
  { what: '~95,000 unknown keys to the payment callback', path: '/orders/:pending/payment-callback', body: manyKeys(CALLBACK), status: 413, code: 'PAYLOAD_TOO_COMPLEX' },
  { what: 'JSON nested 5,000 levels deep to the payment callback (no guard in front)', path: '/orders/:pending/payment-callback', body: deep(5000, CALLBACK), status: 413, code: 'PAYLOAD_TOO_COMPLEX' },
  { what: 'JSON nested 33 levels deep', body: deep(32), status: 413, code: 'PAYLOAD_TOO_COMPLEX' },
  { what: '1,001 values in a nested object', path: '/invoices', headers: invoiceHeaders(), body: json({ terminalId: 'T-1', number: 'N-1', amount: 1, x: Object.fromEntries(Array.from({ length: 1001 }, (_, i) => [`k${i}`, i])) }), status: 413, code: 'PAYLOAD_TOO_COMPLEX' },
  // Inputs PostgreSQL refuses (a NUL: "invalid byte sequence") or cannot hold (over the column's width, out of range).
  { what: 'a NUL as the orderNo in the path', method: 'get', path: '/orders/%00', status: 400, code: 'VALIDATION_FAILED' },
  { what: 'a NUL inside the orderNo in the path', method: 'get', path: '/orders/A%00B', status: 400, code: 'VALIDATION_FAILED' },
  { what: 'an orderNo of 65 characters in the path', method: 'get', path: `/orders/${'O'.repeat(65)}`, status: 400, code: 'VALIDATION_FAILED' },
  { what: 'a NUL as the orderNo of a payment callback', path: '/orders/%00/payment-callback', body: callback({}), status: 400, code: 'VALIDATION_FAILED' },
  { what: 'a NUL as the orderNo of a cancel', path: '/orders/A%00/cancel', status: 400, code: 'VALIDATION_FAILED' },
  { what: 'a NUL in the transactionId', path: '/orders/:pending/payment-callback', body: callback({ transactionId: 'a\u0000b' }), status: 400, code: 'VALIDATION_FAILED' },
  { what: 'a lone surrogate in the transactionId', path: '/orders/:pending/payment-callback', body: '{"transactionId":"a\\ud800b","paidAt":"2026-11-30T10:00:00Z"}', status: 400, code: 'VALIDATION_FAILED' },
  { what: 'a transactionId of 129 characters', path: '/orders/:pending/payment-callback', body: callback({ transactionId: 'T'.repeat(129) }), status: 400, code: 'VALIDATION_FAILED' },
  // helper-211: ISO 8601 forms Date cannot read passed the validator and failed in PostgreSQL.
  { what: 'a paidAt as an ISO week', path: '/orders/:pending/payment-callback', body: callback({ paidAt: '2026-W05' }), status: 400, code: 'VALIDATION_FAILED', message: /paidAt must be/ },
  { what: 'a paidAt without seconds', path: '/orders/:pending/payment-callback', body: callback({ paidAt: '2026-11-30T10:15Z' }), status: 400, code: 'VALIDATION_FAILED', message: /paidAt must be/ },
  { what: 'a paidAt in ISO basic format', path: '/orders/:pending/payment-callback', body: callback({ paidAt: '20260202T000000Z' }), status: 400, code: 'VALIDATION_FAILED', message: /paidAt must be/ },
  { what: 'a paidAt beyond year 9999', path: '/orders/:pending/payment-callback', body: callback({ paidAt: '+275760-09-13T00:00:00Z' }), status: 400, code: 'VALIDATION_FAILED' },
  { what: 'an orderNo of 65 characters', body: json({ orderNo: 'O'.repeat(65), amount: 1 }), status: 400, code: 'VALIDATION_FAILED' },
  { what: 'a NUL in the orderNo', body: json({ orderNo: 'A\u0000B', amount: 1 }), status: 400, code: 'IDEMPOTENCY_KEY_INVALID' },
  { what: 'an amount over numeric(12,2)', body: json({ orderNo: orderNo(), amount: 1e10 }), status: 400, code: 'VALIDATION_FAILED' },
  { what: 'an amount of 2^31 (over a 32-bit integer)', body: json({ orderNo: orderNo(), amount: 2 ** 31 }), status: 400, code: 'VALIDATION_FAILED' },
  { what: 'a NUL in an invoice terminalId', path: '/invoices', headers: invoiceHeaders(), body: json({ terminalId: 'T\u0000', number: 'N-1', amount: 1 }), status: 400, code: 'VALIDATION_FAILED' },
  { what: 'an invoice number of 65 characters', path: '/invoices', headers: invoiceHeaders(), body: json({ terminalId: 'T-1', number: 'N'.repeat(65), amount: 1 }), status: 400, code: 'VALIDATION_FAILED' },
  { what: 'an invoice amount over numeric(12,2)', path: '/invoices', headers: invoiceHeaders(), body: json({ terminalId: 'T-1', number: 'N-1', amount: 1e12 }), status: 400, code: 'VALIDATION_FAILED' },
  { what: 'a NUL as an invoice id', method: 'get', path: '/invoices/%00', status: 404, code: 'INVOICE_NOT_FOUND' },
  { what: 'a NUL as an upload id', method: 'get', path: '/uploads/%00', status: 404, code: 'UPLOAD_NOT_FOUND' },
  { what: 'a JSON array as the body', body: '[{"orderNo":"A-1","amount":1}]', status: 400, code: ['IDEMPOTENCY_KEY_INVALID', 'VALIDATION_FAILED'] },
  { what: 'a JSON null body', body: 'null', status: 400, code: ['IDEMPOTENCY_KEY_MISSING', 'INVALID_JSON'] },
  { what: 'an empty JSON body', body: '', status: 400, code: ['IDEMPOTENCY_KEY_MISSING', 'INVALID_JSON'] },
  { what: 'a bad X-User-Id', headers: { 'x-user-id': 'a b' }, body: json({ orderNo: orderNo(), amount: 1 }), status: 400, code: 'INVALID_USER_ID' },
  { what: 'an X-User-Id of 200 characters', headers: { 'x-user-id': 'u'.repeat(200) }, body: json({ orderNo: orderNo(), amount: 1 }), status: 400, code: 'INVALID_USER_ID' },
  { what: 'a broken percent-encoding in the path', method: 'get', path: '/orders/%E0%A4%A', status: 400, code: ['BAD_REQUEST', 'FST_ERR_BAD_URL'] },
  { what: 'an unknown route', path: '/orders/x/y/z', body: json({}), status: 404, code: 'NOT_FOUND' },
];

// helper-211: Express answered a body its coding did not decode 400 BAD_REQUEST, and a coding it
// does not know 415 "send JSON". Fastify reads request bodies as they come, whatever their
// Content-Encoding says: not bytes of a coding there, they are JSON.
const expressOnly: BadRequest[] = [
  { what: 'a body that is not the gzip its Content-Encoding says', headers: { 'content-encoding': 'gzip' }, body: json({ orderNo: orderNo(), amount: 1 }), status: 400, code: 'INVALID_BODY_ENCODING' },
  { what: 'a truncated gzip body', headers: { 'content-encoding': 'gzip' }, body: gzipSync(json({ orderNo: orderNo(), amount: 1 })).subarray(0, 12), status: 400, code: 'INVALID_BODY_ENCODING' },
  { what: 'a body that is not the br its Content-Encoding says', headers: { 'content-encoding': 'br' }, body: json({ orderNo: orderNo(), amount: 1 }), status: 400, code: 'INVALID_BODY_ENCODING' },
  { what: 'a Content-Encoding the parser does not know', headers: { 'content-encoding': 'zz' }, body: json({ orderNo: orderNo(), amount: 1 }), status: 415, code: 'UNSUPPORTED_MEDIA_TYPE', message: /Content-Encoding/ },
];

describe.each<HttpAdapterName>(['express', 'fastify'])('bad input to the demo (%s)', (adapter) => {
  let app: INestApplication;
  let pending: string;
  /** What a request could have persisted: orders, invoices, and the state of the PENDING order. */
  let persisted: () => Promise<unknown>;

  beforeAll(async () => {
    app = await createDemoApp({
      adapter,
      databaseUrl: DATABASE_URL,
      redisUrl: REDIS_URL,
      keyPrefix: `bad-input-${randomUUID()}`,
      logger: false,
    });
    const dataSource = app.get(DataSource);
    pending = orderNo();
    await request(app.getHttpServer()).post('/orders').set('x-user-id', 'mallory').send({ orderNo: pending, amount: 1 }).expect(201);
    persisted = async () =>
      (
        await dataSource.query(
          `select (select count(*)::int from orders) as orders, (select count(*)::int from invoices) as invoices,
                  (select status || ':' || version from orders where order_no = $1) as pending`,
          [pending],
        )
      )[0];
  });
  afterAll(async () => app.close());

  it('has at least 20 cases', () => expect(cases.length).toBeGreaterThanOrEqual(20));

  it.each(adapter === 'express' ? [...cases, ...expressOnly] : cases)('$what → $status $code, nothing persisted', async (c) => {
    const before = await persisted();
    const method = c.method ?? 'post';
    const path = (c.path ?? '/orders').replace(':pending', pending);
    let req = request(app.getHttpServer())[method](path).set('x-user-id', 'mallory');
    for (const [name, value] of Object.entries(c.headers ?? {})) req = req.set(name, value);
    if (method === 'post' && c.body !== undefined) {
      req = req.set('content-type', c.contentType ?? 'application/json');
      // Raw bytes as they are: superagent would JSON-encode a Buffer.
      req = Buffer.isBuffer(c.body) ? req.serialize(((body: Buffer) => body) as never).send(c.body as never) : req.send(c.body as string);
    }
    const res = await req;
    expect([c.status].flat()).toContain(res.status);
    expect([c.code].flat()).toContain(res.body.code);
    if (c.message) expect(JSON.stringify(res.body.message)).toMatch(c.message);
    expect(await persisted()).toEqual(before);
  });
});

/**
 * The exception filter's backstop behind the validators: a value PostgreSQL refuses (a NUL, too
 * long, out of range) that validation missed is a 400 `VALIDATION_FAILED`, not a 500.
 */
describe('the demo exception filter and values PostgreSQL refuses', () => {
  let dataSource: DataSource;

  beforeAll(async () => {
    dataSource = await new DataSource({ type: 'postgres', url: DATABASE_URL }).initialize();
  });
  afterAll(async () => dataSource?.destroy());

  /** `sql` run with `param` in a transaction with a temporary table `t (v varchar(4))`. */
  const run = (sql: string, param: string) =>
    dataSource.transaction(async (manager) => {
      await manager.query('create temporary table t (v varchar(4)) on commit drop');
      return manager.query(sql, [param]);
    });

  /** The answer the filter gives to the error of `sql` (a real QueryFailedError from PostgreSQL). */
  const answerTo = async (sql: string, param: string) => {
    const error = await run(sql, param).then(
      () => undefined,
      (failure: unknown) => failure,
    );
    expect(error).toBeDefined();
    let answer: { body?: { code?: string; message?: unknown }; status?: number } = {};
    const httpAdapter = {
      isHeadersSent: () => false,
      getHeader: () => undefined,
      setHeader: () => undefined,
      reply: (_response: unknown, body: { code?: string }, status: number) => (answer = { body, status }),
    };
    const host = { getType: () => 'http', switchToHttp: () => ({ getResponse: () => ({}) }) } as unknown as ArgumentsHost;
    new DemoExceptionFilter({ httpAdapter } as unknown as HttpAdapterHost).catch(error, host);
    return answer;
  };

  it.each([
    ['a NUL (22021)', 'select $1::text', 'a\u0000b'],
    ['a NUL escape in JSON (22P05)', 'select $1::jsonb', '{"a":"\\u0000"}'],
    ['a string over varchar(4) (22001)', 'insert into t (v) values ($1)', 'abcdefgh'],
    ['an integer out of range (22003)', 'select $1::integer', '3000000000'],
    ['a number over numeric(12,2) (22003)', 'select $1::numeric(12,2)', '1e10'],
    ['a date out of range (22008)', 'select $1::timestamptz', '294277-01-01T00:00:00Z'],
    ['a malformed uuid (22P02)', 'select $1::uuid', 'nope'],
  ])('answers %s with 400 VALIDATION_FAILED', async (_what, sql, param) => {
    const answer = await answerTo(sql, param);
    expect(answer.status).toBe(400);
    expect(answer.body).toMatchObject({ code: 'VALIDATION_FAILED', message: [expect.stringMatching(/cannot be stored/)] });
  });

  it('still answers other database errors with 500 INTERNAL_ERROR', async () => {
    const answer = await answerTo('select * from no_such_table_here where $1::text is null', 'x');
    expect([answer.status, answer.body?.code]).toEqual([500, 'INTERNAL_ERROR']);
  });
});
