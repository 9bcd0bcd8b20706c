import { afterAll, beforeAll, describe, expect, it } from '@jest/globals';
import type { Redis } from 'ioredis';
import { randomUUID } from 'node:crypto';
import pg from 'pg';
import { RedisIdempotencyStore, buildStorageKey } from '../libs/idempotency/src/index.js';
import { startDemoProcess, type DemoProcess } from './support/demo-process.js';
import { until } from './support/http.js';
import { DATABASE_URL, REDIS_URL, connectRedis } from './support/services.js';

// Long enough that the dead request's lease still holds when the survivor claims at once after
// the kill, on a loaded CI machine too (1 s left it 0.7 s, which a freeze of the test overran).
const LEASE_SECONDS = 3;

describe('kill -9 of an app process in the middle of a request', () => {
  let victim: DemoProcess;
  let survivor: DemoProcess;
  let redis: Redis;
  let db: pg.Client;

  beforeAll(async () => {
    const env = { DATABASE_URL, REDIS_URL, IDEMPOTENCY_LEASE_SECONDS: String(LEASE_SECONDS) };
    [victim, survivor] = await Promise.all([startDemoProcess(env), startDemoProcess(env)]);
    redis = await connectRedis();
    db = new pg.Client({ connectionString: DATABASE_URL });
    await db.connect();
  }, 60_000);
  afterAll(async () => {
    await Promise.all([victim?.stop('SIGKILL'), survivor?.stop()]);
    redis?.disconnect();
    await db?.end();
  });

  it('keeps the key while the handler lives, frees it within one lease of the kill: the retry succeeds exactly once', async () => {
    const orderNo = `CRASH-${randomUUID()}`;
    const key = buildStorageKey({ prefix: 'demo', user: { id: 'crash' }, handler: 'OrdersController.create', key: orderNo });
    const post = (instance: DemoProcess) =>
      fetch(`${instance.baseUrl}/orders`, {
        method: 'POST',
        headers: { 'content-type': 'application/json', 'x-user-id': 'crash' },
        body: JSON.stringify({ orderNo, amount: 3 }),
      });

    // Hold the first request inside its handler: its INSERT waits for this table lock.
    await db.query('BEGIN');
    await db.query('LOCK TABLE orders IN EXCLUSIVE MODE');
    const lost = post(victim).catch((error: Error) => error);
    const store = new RedisIdempotencyStore(redis);
    await until(async () => (await store.get(key))?.state === 'processing');
    // Three leases later the live handler still holds its key: its process renews the claim.
    await new Promise((resolve) => setTimeout(resolve, 3 * LEASE_SECONDS * 1000));
    const whileAlive = await post(survivor);
    expect(whileAlive.status).toBe(409);
    await victim.stop('SIGKILL');
    expect(await lost).toHaveProperty('message', 'fetch failed'); // the client saw the connection die

    // Unlocked before the survivor claims: a survivor that found the key free would otherwise
    // wait on the lock for the rest of the test.
    await db.query('ROLLBACK');
    const atOnce = await post(survivor);
    expect(atOnce.status).toBe(409); // the lease of the dead request still holds
    expect(Number(atOnce.headers.get('retry-after'))).toBeGreaterThanOrEqual(1);

    // Nobody renews a dead process's claim: from at most one lease, its time to live only falls
    // until the key is gone (read by Redis's clock, whatever the test's own pace).
    const ttls: number[] = [];
    await until(async () => {
      ttls.push(await redis.pttl(key));
      return ttls[ttls.length - 1] < 0;
    }, 2 * LEASE_SECONDS * 1000);
    const rose = ttls.slice(0, -1).some((ttl, i) => i > 0 && ttl > ttls[i - 1]);
    expect({ first: ttls[0] <= LEASE_SECONDS * 1000, rose }).toEqual({ first: true, rose: false });
    const retry = await post(survivor);
    // 201 if the dead request's INSERT never ran; 200 (the existing order) if PostgreSQL ran it
    // after the lock was released (it does not notice a dead client before it commits).
    expect([200, 201]).toContain(retry.status);
    expect(((await retry.json()) as { orderNo: string }).orderNo).toBe(orderNo);
    const { rows } = await db.query('select count(*)::int as n from orders where order_no = $1', [orderNo]);
    expect(rows[0].n).toBe(1);
    const replay = await post(survivor);
    expect(replay.headers.get('idempotent-replayed')).toBe('true');
  }, 60_000);
});
