// The demo's admin routes (apps/demo/src/admin/) with odd path parameters, and inspections and
// forgets through `?storageKey=` of keys that hold no idempotency record.
import { afterAll, beforeAll, describe, expect, it } from '@jest/globals';
import { Redis } from 'ioredis';
import { randomUUID } from 'node:crypto';
import { request as httpRequest } from 'node:http';
import { buildStorageKey, MAX_KEY_LENGTH } from 'nestjs-idempotency';
import type { HttpAdapterName } from '../apps/demo/src/demo-app.factory.js';
import { listenDemo, postJson, type ListeningDemo } from './support/demo-server.js';
import { DATABASE_URL, REDIS_URL } from './support/services.js';

const TOKEN = `admin-${randomUUID()}`;
const HANDLER = 'OrdersController.create';

/**
 * A request whose path goes out exactly as written. Neither fetch nor `http.request(url)` does
 * that: both parse a URL (WHATWG), which resolves `.` and `..` segments before sending
 * (`/a/b/..` goes out as `/a/`). Here the path is given as it stands.
 */
function rawRequest(baseUrl: string, method: string, path: string): Promise<{ status: number; body: Record<string, unknown> }> {
  const { hostname, port } = new URL(baseUrl);
  return new Promise((resolve, reject) => {
    const req = httpRequest({ host: hostname, port, path, method, agent: false, headers: { 'x-admin-token': TOKEN } }, (res) => {
      const chunks: Buffer[] = [];
      res.on('data', (chunk: Buffer) => chunks.push(chunk));
      res.on('end', () => {
        const text = Buffer.concat(chunks).toString();
        let body: Record<string, unknown>;
        try {
          body = JSON.parse(text) as Record<string, unknown>;
        } catch {
          body = { text };
        }
        resolve({ status: res.statusCode!, body });
      });
    });
    req.on('error', reject);
    req.end();
  });
}

describe.each(['express', 'fastify'] as HttpAdapterName[])('the demo admin routes with odd keys (%s, Redis store)', (adapter) => {
  let demo: ListeningDemo;
  let keyPrefix: string;
  let redis: Redis;
  beforeAll(async () => {
    keyPrefix = `rvad-${randomUUID().slice(0, 8)}`;
    redis = new Redis(REDIS_URL);
    demo = await listenDemo({ adapter, databaseUrl: DATABASE_URL, redisUrl: REDIS_URL, keyPrefix, adminToken: TOKEN });
  });
  afterAll(async () => {
    await demo?.app.close();
    redis?.disconnect();
  });

  const expectedKey = (key: string) => buildStorageKey({ prefix: keyPrefix, user: { anonymous: true }, handler: HANDLER, key });

  // Fastify's router refuses params over its maxParamLength (default 100) with 414: the demo raises
  // it so that every key the guard takes, 255 characters of 4 bytes percent-encoded, reaches the route.
  it.each([
    ['a percent sign', '50%off'],
    ['a colon', 'A:1'],
    ['a slash', 'a/b'],
    ['a question mark and a hash', 'a?b#c'],
    ['a space and a plus', 'a b+c'],
    ['unicode (BMP and astral)', 'é日本𝄞'],
    ['100 characters', 'k'.repeat(100)],
    ['101 characters', 'k'.repeat(101)],
    ['255 characters (the longest key)', 'k'.repeat(MAX_KEY_LENGTH)],
    ['255 4-byte characters (12 characters each, percent-encoded)', '\u{1D11E}'.repeat(MAX_KEY_LENGTH)],
  ])('inspects a key with %s under its own storage key', async (_name, key) => {
    const res = await rawRequest(demo.baseUrl, 'GET', `/admin/idempotency/${HANDLER}/${encodeURIComponent(key)}`);
    expect(res).toMatchObject({ status: 200, body: { storageKey: expectedKey(key), state: 'absent' } });
  });

  it('answers 400 to a key of 256 characters', async () => {
    const res = await rawRequest(demo.baseUrl, 'GET', `/admin/idempotency/${HANDLER}/${'k'.repeat(MAX_KEY_LENGTH + 1)}`);
    expect(res).toMatchObject({ status: 400, body: { code: 'VALIDATION_FAILED' } });
    const astral = encodeURIComponent('\u{1D11E}'.repeat(MAX_KEY_LENGTH + 1));
    expect(await rawRequest(demo.baseUrl, 'GET', `/admin/idempotency/${HANDLER}/${astral}`)).toMatchObject({ status: 400, body: { code: 'VALIDATION_FAILED' } });
  });

  it('answers 400, never a 500, to a malformed percent-encoding', async () => {
    for (const path of [`/admin/idempotency/${HANDLER}/%E0%A4%A`, `/admin/idempotency/${HANDLER}/%`, `/admin/idempotency/${HANDLER}/a%zzb`]) {
      const res = await rawRequest(demo.baseUrl, 'GET', path);
      expect({ path, status: res.status }).toEqual({ path, status: 400 });
    }
  });

  it('forgets the order "A:1" (a colon, as orderNo allows) and leaves "A" and "1" alone', async () => {
    const base = randomUUID().slice(0, 8);
    const orders = [`${base}:1`, base, '1'.concat(base)];
    for (const orderNo of orders) expect((await postJson(`${demo.baseUrl}/orders`, { orderNo, amount: 1 })).status).toBe(201);
    const res = await rawRequest(demo.baseUrl, 'DELETE', `/admin/idempotency/${HANDLER}/${encodeURIComponent(orders[0])}`);
    expect(res).toMatchObject({ status: 200, body: { forgotten: true, storageKey: expectedKey(orders[0]) } });
    for (const orderNo of orders.slice(1)) expect(await redis.exists(expectedKey(orderNo))).toBe(1);
  });

  // '.' and '..' are dot segments: a client (fetch, curl, a browser) resolves them before sending,
  // so `/admin/idempotency/OrdersController.create/..` goes out as `/admin/idempotency/`, and
  // `GET /orders/..` as `/`. No path could reach such an order or its record: they are refused
  // when an order is created. Orders with other dots stay valid and are forgotten by their parts.
  it('refuses the orderNos "." and ".." (no path can hold them); forgets orders with other dots by their parts, and no other record', async () => {
    for (const orderNo of ['.', '..']) {
      await redis.del(expectedKey(orderNo));
      const created = await postJson(`${demo.baseUrl}/orders`, { orderNo, amount: 1 });
      expect({ orderNo, status: created.status, body: created.body }).toMatchObject({
        orderNo,
        status: 400,
        body: { code: 'VALIDATION_FAILED', message: ['orderNo must not be "." or "..": no URL path can hold them'] },
      });
      expect(await redis.exists(expectedKey(orderNo))).toBe(0);
    }
    const base = randomUUID().slice(0, 8);
    const dotted = [`...${base}`, `.${base}`, `${base}..`];
    const other = `o-${randomUUID()}`;
    for (const orderNo of [...dotted, other]) expect((await postJson(`${demo.baseUrl}/orders`, { orderNo, amount: 1 })).status).toBe(201);
    for (const orderNo of dotted) {
      const res = await rawRequest(demo.baseUrl, 'DELETE', `/admin/idempotency/${HANDLER}/${encodeURIComponent(orderNo)}`);
      expect(res).toMatchObject({ status: 200, body: { forgotten: true, storageKey: expectedKey(orderNo) } });
    }
    // A '..' segment sent as it stands forgets nothing else (by parts, the key '..' holds no record).
    const res = await rawRequest(demo.baseUrl, 'DELETE', `/admin/idempotency/${HANDLER}/..`);
    expect(res.status).not.toBe(200);
    expect(res.status).toBeLessThan(500);
    expect(await redis.exists(expectedKey(other))).toBe(1);
  });

  // A string of the app's that starts with C, as a completed record does: FORGET_LUA knows a record
  // by its whole encoding, not its first byte.
  it('never deletes a Redis key that holds no idempotency record (a storage key given as it stands)', async () => {
    const plain = `${keyPrefix}:app-data:${randomUUID()}`;
    await redis.set(plain, 'Canada', 'EX', 60);
    const res = await rawRequest(demo.baseUrl, 'DELETE', `/admin/idempotency?storageKey=${encodeURIComponent(plain)}`);
    expect(res.status).not.toBe(200);
    expect(res).toMatchObject({ status: 409, body: { storageKey: plain, forgotten: false, reason: 'not_a_record', code: 'IDEMPOTENCY_NOT_A_RECORD' } });
    const inspected = await rawRequest(demo.baseUrl, 'GET', `/admin/idempotency?storageKey=${encodeURIComponent(plain)}`);
    expect(inspected).toMatchObject({ status: 409, body: { storageKey: plain, state: 'not_a_record', code: 'IDEMPOTENCY_NOT_A_RECORD' } });
    expect(await redis.get(plain)).toBe('Canada');
  });

  // A key of another type: the script checks TYPE first, and a read's WRONGTYPE is "not a record", not a 500.
  it('answers a key of another Redis type (a hash) with a clear error, not a 500, and keeps it', async () => {
    const hash = `${keyPrefix}:app-hash:${randomUUID()}`;
    await redis.hset(hash, 'a', '1');
    await redis.expire(hash, 60);
    for (const method of ['GET', 'DELETE']) {
      const res = await rawRequest(demo.baseUrl, method, `/admin/idempotency?storageKey=${encodeURIComponent(hash)}`);
      expect({ method, status: res.status < 500 }).toEqual({ method, status: true });
      expect({ method, res }).toMatchObject({ method, res: { status: 409, body: { storageKey: hash, code: 'IDEMPOTENCY_NOT_A_RECORD' } } });
    }
    expect(await redis.hget(hash, 'a')).toBe('1');
  });

  it('never shows the record\'s token, body or header values', async () => {
    const orderNo = `leak-${randomUUID()}`;
    const created = await postJson(`${demo.baseUrl}/orders`, { orderNo, amount: 1234.56 });
    const value = (await redis.get(expectedKey(orderNo)))!;
    const token = (JSON.parse(value.slice(1, value.indexOf('\n'))) as string[])[0];
    const res = await rawRequest(demo.baseUrl, 'GET', `/admin/idempotency/${HANDLER}/${orderNo}`);
    const text = JSON.stringify(res.body);
    expect(res.body).toMatchObject({ state: 'completed' });
    expect(text).not.toContain(token);
    expect(text).not.toContain('1234.56');
    expect(text).not.toContain(String((created.body as { id?: unknown }).id));
  });
});
