import { afterAll, beforeAll, describe, expect, it } from '@jest/globals';
import type { INestApplication } from '@nestjs/common';
import { randomUUID } from 'node:crypto';
import request from 'supertest';
import { DataSource } from 'typeorm';
import type { HttpAdapterName } from '../apps/demo/src/demo-app.factory.js';
import { listenDemo, postJson } from './support/demo-server.js';
import { DATABASE_URL } from './support/services.js';

const UUID = /^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$/;

/**
 * Invoices: idempotent by the database alone (no guard), with the client's X-Idempotency-Token
 * as a unique column and (terminal, number) as another.
 */
describe.each<HttpAdapterName>(['express', 'fastify'])('POST /invoices with X-Idempotency-Token (%s)', (adapter) => {
  let app: INestApplication;
  let baseUrl: string;
  beforeAll(async () => {
    ({ app, baseUrl } = await listenDemo({ adapter, databaseUrl: DATABASE_URL, keyPrefix: `invoices-${randomUUID()}` }));
  });
  afterAll(async () => app?.close());

  const newInvoice = () => ({ terminalId: `T-${randomUUID().slice(0, 8)}`, number: `INV-${randomUUID().slice(0, 8)}`, amount: 99.9 });
  const post = (body: object, token?: string) => {
    const req = request(app.getHttpServer()).post('/invoices');
    if (token !== undefined) req.set('X-Idempotency-Token', token);
    return req.send(body);
  };
  const countRows = async (terminalId: string): Promise<number> =>
    (await app.get(DataSource).query('select count(*)::int as n from invoices where terminal_id = $1', [terminalId]))[0].n;

  it('creates an invoice (201), reads it back, and answers a retry with the same token 200 with it', async () => {
    const body = newInvoice();
    const token = randomUUID();
    const created = await post(body, token);
    expect(created.status).toBe(201);
    expect(Object.keys(created.body).sort()).toEqual(['amount', 'createdAt', 'id', 'number', 'terminalId']);
    expect(created.body).toMatchObject(body);
    expect(created.body.id).toMatch(UUID);

    const retry = await post(body, token);
    expect(retry.status).toBe(200);
    expect(retry.body).toEqual(created.body);
    // A UUID is a UUID in any case.
    const upper = await post(body, token.toUpperCase());
    expect([upper.status, upper.body]).toEqual([200, created.body]);

    const read = await request(app.getHttpServer()).get(`/invoices/${created.body.id}`);
    expect([read.status, read.body]).toEqual([200, created.body]);
    expect(await countRows(body.terminalId)).toBe(1);
  });

  it('answers 422 IDEMPOTENCY_TOKEN_REUSED, without the invoice, for the same token with another body', async () => {
    const body = newInvoice();
    const token = randomUUID();
    await post(body, token).expect(201);
    for (const other of [{ ...body, amount: 100 }, { ...body, number: `${body.number}-2` }, { ...body, terminalId: `${body.terminalId}-2` }]) {
      const res = await post(other, token);
      expect(res.status).toBe(422);
      expect(Object.keys(res.body).sort()).toEqual(['code', 'error', 'message', 'statusCode']);
      expect(res.body).toMatchObject({ statusCode: 422, code: 'IDEMPOTENCY_TOKEN_REUSED' });
    }
    expect(await countRows(body.terminalId)).toBe(1);
    expect(await countRows(`${body.terminalId}-2`)).toBe(0);
  });

  it('answers 409 INVOICE_NUMBER_EXISTS for another token with the same terminal and number', async () => {
    const body = newInvoice();
    await post(body, randomUUID()).expect(201);
    const res = await post(body, randomUUID());
    expect(res.status).toBe(409);
    expect(res.body).toMatchObject({ statusCode: 409, code: 'INVOICE_NUMBER_EXISTS' });
    expect(res.body.id).toBeUndefined();
    // Another terminal may use the same number.
    await post({ ...body, terminalId: `${body.terminalId}-B` }, randomUUID()).expect(201);
    expect(await countRows(body.terminalId)).toBe(1);
  });

  it('turns 30 concurrent identical requests into one invoice: one 201 and 29 times 200 with it', async () => {
    const body = newInvoice();
    const token = randomUUID();
    const answers = await Promise.all(
      Array.from({ length: 30 }, () => postJson<{ id: string }>(`${baseUrl}/invoices`, body, { 'x-idempotency-token': token })),
    );
    const statuses = answers.map((answer) => answer.status);
    expect(statuses.filter((status) => status === 201)).toHaveLength(1);
    expect(statuses.filter((status) => status === 200)).toHaveLength(29);
    const created = answers.find((answer) => answer.status === 201)!.body;
    for (const answer of answers) expect(answer.body).toEqual(created);
    expect(await countRows(body.terminalId)).toBe(1);
  });

  it('answers 400 IDEMPOTENCY_TOKEN_MISSING without the header and 400 IDEMPOTENCY_TOKEN_INVALID for a non-UUID', async () => {
    const body = newInvoice();
    const missing = await post(body);
    expect([missing.status, missing.body.code]).toEqual([400, 'IDEMPOTENCY_TOKEN_MISSING']);
    for (const token of ['abc', '', `${randomUUID()}x`, randomUUID().replaceAll('-', '')]) {
      const invalid = await post(body, token);
      expect([invalid.status, invalid.body.code]).toEqual([400, 'IDEMPOTENCY_TOKEN_INVALID']);
    }
    expect(await countRows(body.terminalId)).toBe(0);
  });

  it.each([
    ['no terminalId', { number: 'N-1', amount: 1 }],
    ['an amount with 3 decimals', { terminalId: 'T-1', number: 'N-1', amount: 1.234 }],
    ['a number with a space', { terminalId: 'T-1', number: 'N 1', amount: 1 }],
    ['an unknown property', { terminalId: 'T-1', number: 'N-1', amount: 1, idempotencyToken: 'x' }],
  ])('answers 400 VALIDATION_FAILED for %s', async (_what, body) => {
    const res = await post(body, randomUUID());
    expect([res.status, res.body.code]).toEqual([400, 'VALIDATION_FAILED']);
  });

  it('answers 404 INVOICE_NOT_FOUND for an unknown id and for an id that is not a UUID', async () => {
    for (const id of [randomUUID(), 'not-a-uuid']) {
      const res = await request(app.getHttpServer()).get(`/invoices/${id}`);
      expect([res.status, res.body.code]).toEqual([404, 'INVOICE_NOT_FOUND']);
    }
  });
});
