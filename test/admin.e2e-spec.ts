import { afterAll, beforeAll, describe, expect, it } from '@jest/globals';
import { randomUUID } from 'node:crypto';
import pg from 'pg';
import { DataSource } from 'typeorm';
import type { HttpAdapterName } from '../apps/demo/src/demo-app.factory.js';
import { listenDemo, postJson, type ListeningDemo } from './support/demo-server.js';
import { until } from './support/http.js';
import { DATABASE_URL, REDIS_URL } from './support/services.js';
import { TcpProxy } from './support/tcp-proxy.js';

const TOKEN = `admin-${randomUUID()}`;
const USER = 'support-case';
const HANDLER = 'OrdersController.create';

type StoreName = 'redis' | 'memory';
const cases: [HttpAdapterName, StoreName][] = [
  ['express', 'redis'],
  ['express', 'memory'],
  ['fastify', 'redis'],
  ['fastify', 'memory'],
];

describe.each(cases)('the demo\'s idempotency admin (%s, %s store)', (adapter, store) => {
  let demo: ListeningDemo;
  let keyPrefix: string;
  beforeAll(async () => {
    keyPrefix = `admin-${randomUUID()}`;
    demo = await listenDemo({
      adapter,
      databaseUrl: DATABASE_URL,
      redisUrl: store === 'redis' ? REDIS_URL : undefined,
      keyPrefix,
      adminToken: TOKEN,
    });
  });
  afterAll(async () => demo?.app.close());

  const order = (orderNo: string) => postJson(`${demo.baseUrl}/orders`, { orderNo, amount: 7 }, { 'x-user-id': USER });
  const admin = (method: 'GET' | 'DELETE', orderNo: string, headers: Record<string, string> = { 'x-admin-token': TOKEN }) =>
    fetch(`${demo.baseUrl}/admin/idempotency/${HANDLER}/${encodeURIComponent(orderNo)}?user=${USER}`, { method, headers }).then(
      async (res) => ({ status: res.status, body: (await res.json()) as Record<string, unknown> }),
    );

  it('describes a completed order: its status code, size, replayable, retention; by its parts and by its storage key', async () => {
    const orderNo = `ADM-${randomUUID()}`;
    const created = await order(orderNo);
    expect(created.status).toBe(201);
    const { status, body } = await admin('GET', orderNo);
    expect(status).toBe(200);
    const storageKey = `${keyPrefix}:${USER}:${HANDLER}:${orderNo}`;
    expect(body).toMatchObject({
      storageKey,
      state: 'completed',
      statusCode: 201,
      replayable: true,
      bodyBytes: Buffer.byteLength(JSON.stringify(created.body)),
      headerNames: expect.arrayContaining(['content-type']),
    });
    // Retention of the route (expireSeconds: 86400), by the store's clock.
    expect(body.retentionLeftMs).toBeGreaterThan(86_000_000);
    expect(Date.parse(body.expiresAt as string)).toBeGreaterThan(Date.now() + 86_000_000);
    const byStorageKey = await fetch(`${demo.baseUrl}/admin/idempotency?storageKey=${encodeURIComponent(storageKey)}`, {
      headers: { 'x-admin-token': TOKEN },
    });
    expect(await byStorageKey.json()).toMatchObject({ storageKey, state: 'completed', statusCode: 201 });
    expect(await admin('GET', `ADM-${randomUUID()}`)).toMatchObject({ status: 200, body: { state: 'absent' } });
  });

  it('forgets a completed order: before, retries are replays; after, the handler runs once more', async () => {
    const orderNo = `ADM-${randomUUID()}`;
    expect(await order(orderNo)).toMatchObject({ status: 201, replayed: null });
    expect(await order(orderNo)).toMatchObject({ status: 201, replayed: 'true' });
    expect(await admin('DELETE', orderNo)).toEqual({
      status: 200,
      body: { storageKey: `${keyPrefix}:${USER}:${HANDLER}:${orderNo}`, forgotten: true },
    });
    expect(await admin('GET', orderNo)).toMatchObject({ body: { state: 'absent' } });
    // The handler runs again: it finds the order its first run created (200, not a replay).
    const again = await order(orderNo);
    expect(again).toMatchObject({ status: 200, replayed: null, body: { orderNo, userId: USER } });
    expect(await order(orderNo)).toMatchObject({ status: 200, replayed: 'true' });
    expect(await admin('DELETE', orderNo)).toMatchObject({ status: 200, body: { forgotten: true } });
    expect(await admin('DELETE', orderNo)).toMatchObject({
      status: 404,
      body: { forgotten: false, reason: 'absent', code: 'IDEMPOTENCY_RECORD_ABSENT' },
    });
  });

  it('refuses to forget an order whose request is running, and the running request still completes it once', async () => {
    const orderNo = `ADM-${randomUUID()}`;
    const db = new pg.Client({ connectionString: DATABASE_URL });
    await db.connect();
    try {
      // Hold the request inside its handler: its INSERT waits on this uncommitted row's unique key.
      await db.query('BEGIN');
      await db.query(`INSERT INTO orders (order_no, user_id, amount) VALUES ($1, 'holder', 1)`, [orderNo]);
      const running = order(orderNo);
      await until(async () => (await admin('GET', orderNo)).body.state === 'in_progress');
      const inspected = await admin('GET', orderNo);
      expect(inspected.body.leaseLeftMs).toBeGreaterThan(0);
      expect(await admin('DELETE', orderNo)).toMatchObject({
        status: 409,
        body: { forgotten: false, reason: 'in_progress', code: 'IDEMPOTENCY_RECORD_IN_PROGRESS' },
      });
      // Still fenced: a duplicate is refused, not run beside the live handler.
      expect(await order(orderNo)).toMatchObject({ status: 409, body: { code: 'IDEMPOTENCY_IN_PROGRESS' } });
      await db.query('ROLLBACK');
      expect(await running).toMatchObject({ status: 201, replayed: null });
    } finally {
      await db.query('ROLLBACK').catch(() => undefined);
      await db.end();
    }
    expect(await admin('GET', orderNo)).toMatchObject({ body: { state: 'completed', statusCode: 201 } });
    const [{ count }] = await demo.app.get(DataSource).query('SELECT count(*)::int AS count FROM orders WHERE order_no = $1', [orderNo]);
    expect(count).toBe(1);
  });

  it('refuses the admin routes without the token, or with a wrong one, and forgets nothing then', async () => {
    const orderNo = `ADM-${randomUUID()}`;
    await order(orderNo);
    const refused: Record<string, string>[] = [{}, { 'x-admin-token': 'wrong' }, { 'x-admin-token': `${TOKEN}x` }];
    for (const headers of refused) {
      for (const method of ['GET', 'DELETE'] as const) {
        expect(await admin(method, orderNo, headers)).toMatchObject({ status: 403, body: { code: 'ADMIN_TOKEN_INVALID' } });
      }
    }
    const raw = await fetch(`${demo.baseUrl}/admin/idempotency?storageKey=x`, { method: 'DELETE' });
    expect(raw.status).toBe(403);
    expect(await order(orderNo)).toMatchObject({ status: 201, replayed: 'true' });
  });

  // An adversarial helper: `?userId=alice` (a typo) forgot the anonymous callers' record of that
  // key, and `?storageKey=a&storageKey=b` forgot "a,b": a destructive route read what it was not sent.
  it('refuses a query parameter it does not take, or one given twice, and forgets nothing then', async () => {
    const orderNo = `TYPO-${randomUUID()}`;
    expect((await postJson(`${demo.baseUrl}/orders`, { orderNo, amount: 7 })).status).toBe(201);
    const headers = { 'x-admin-token': TOKEN };
    const storageKey = `${keyPrefix}:anon::${HANDLER}:${orderNo}`;
    const wrong = [
      `${HANDLER}/${orderNo}?userId=alice`,
      `${HANDLER}/${orderNo}?User=alice`,
      `${HANDLER}/${orderNo}?user=a&user=b`,
      `?storageKey=${encodeURIComponent(storageKey)}&storageKey=b`,
      `?storageKey=${encodeURIComponent(storageKey)}&user=alice`,
    ];
    for (const path of wrong) {
      const res = await fetch(`${demo.baseUrl}/admin/idempotency${path.startsWith('?') ? '' : '/'}${path}`, { method: 'DELETE', headers });
      expect({ path, status: res.status, code: ((await res.json()) as { code?: string }).code }).toEqual({ path, status: 400, code: 'VALIDATION_FAILED' });
    }
    const still = await fetch(`${demo.baseUrl}/admin/idempotency?storageKey=${encodeURIComponent(storageKey)}`, { headers });
    expect(((await still.json()) as { state: string }).state).toBe('completed');
  });

  it('answers 400 for a handler or a user the guard never keys by', async () => {
    const headers = { 'x-admin-token': TOKEN };
    const bad = await fetch(`${demo.baseUrl}/admin/idempotency/orders/A-1?user=${USER}`, { headers });
    expect(bad.status).toBe(400);
    expect(await bad.json()).toMatchObject({ code: 'VALIDATION_FAILED' });
    const badUser = await fetch(`${demo.baseUrl}/admin/idempotency/${HANDLER}/A-1?user=a%20b`, { headers });
    expect(badUser.status).toBe(400);
  });
});

// An adversarial helper: with Redis stopped or paused, inspect and forget answered 500 with a stack
// trace (the guard itself answers 503), and a forget that timed out had still deleted the record.
describe("the demo's idempotency admin while Redis does not answer", () => {
  let demo: ListeningDemo;
  let proxy: TcpProxy;
  beforeAll(async () => {
    const redis = new URL(REDIS_URL);
    proxy = await new TcpProxy({ host: redis.hostname, port: Number(redis.port || 6379) }).start();
    demo = await listenDemo({ adapter: 'express', databaseUrl: DATABASE_URL, redisUrl: proxy.url, keyPrefix: `admin-down-${randomUUID()}`, adminToken: TOKEN });
  });
  afterAll(async () => {
    await demo?.app.close();
    await proxy?.stop();
  });

  it('answers 503 IDEMPOTENCY_STORE_UNAVAILABLE, saying the outcome is unknown', async () => {
    proxy.refusing = true;
    proxy.cut();
    try {
      for (const method of ['GET', 'DELETE']) {
        const res = await fetch(`${demo.baseUrl}/admin/idempotency/${HANDLER}/A-1?user=${USER}`, { method, headers: { 'x-admin-token': TOKEN } });
        const body = (await res.json()) as { code?: string; message?: string };
        expect({ method, status: res.status, code: body.code }).toEqual({ method, status: 503, code: 'IDEMPOTENCY_STORE_UNAVAILABLE' });
        expect(body.message).toMatch(/may or may not have happened/);
      }
    } finally {
      proxy.refusing = false;
    }
  });
});

describe('the demo without ADMIN_TOKEN', () => {
  let demo: ListeningDemo;
  beforeAll(async () => {
    demo = await listenDemo({ adapter: 'express', databaseUrl: DATABASE_URL, keyPrefix: `admin-off-${randomUUID()}` });
  });
  afterAll(async () => demo?.app.close());

  it('answers 404 on the admin routes, whatever token is sent', async () => {
    const tokens: Record<string, string>[] = [{}, { 'x-admin-token': '' }, { 'x-admin-token': 'undefined' }];
    for (const headers of tokens) {
      for (const method of ['GET', 'DELETE']) {
        const res = await fetch(`${demo.baseUrl}/admin/idempotency/${HANDLER}/A-1?user=${USER}`, { method, headers });
        expect(res.status).toBe(404);
      }
    }
  });

  it('refuses to start with a short ADMIN_TOKEN', async () => {
    await expect(listenDemo({ adapter: 'express', databaseUrl: DATABASE_URL, adminToken: 'short' })).rejects.toThrow(
      'ADMIN_TOKEN must be at least 16 characters',
    );
  });

  // An adversarial helper: HTTP trims a header value's spaces, so such a token could never match.
  it('refuses to start with an ADMIN_TOKEN that starts or ends with spaces', async () => {
    await expect(listenDemo({ adapter: 'express', databaseUrl: DATABASE_URL, adminToken: ` ${randomUUID()}` })).rejects.toThrow(
      'ADMIN_TOKEN must not start or end with spaces',
    );
  });
});
