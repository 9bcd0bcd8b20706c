import { afterAll, beforeAll, describe, expect, it } from '@jest/globals';
import type { Redis } from 'ioredis';
import { randomUUID } from 'node:crypto';
import { connectRedis } from '../../../../../test/support/services.js';
import { describeStoreContract } from '../../testing/index.js';
import { RedisIdempotencyStore } from './redis-idempotency.store.js';
import { decodeRecord, encodeProcessing } from './redis-record.js';

const sleep = (ms: number) => new Promise<void>((resolve) => setTimeout(resolve, ms));

describe('RedisIdempotencyStore', () => {
  let client: Redis;
  beforeAll(async () => {
    client = await connectRedis();
  });
  afterAll(async () => {
    await client.quit();
  });

  // Redis expiry itself is under test here, so these wait real (short) leases out.
  describeStoreContract(
    'redis',
    async () => {
      const store = new RedisIdempotencyStore(client);
      return { store, elapse: sleep, close: () => store.onApplicationShutdown() };
    },
    200,
  );

  it('has Redis expire the lease and the retention (PTTL), not the client clock', async () => {
    const store = new RedisIdempotencyStore(client);
    const key = `ttl:${randomUUID()}`;
    await store.claim({ key, token: 't', fingerprint: '', leaseMs: 5_000 });
    const leasePttl = await client.pttl(key);
    expect(leasePttl).toBeGreaterThan(4_000);
    expect(leasePttl).toBeLessThanOrEqual(5_000);
    await store.complete(key, 't', { statusCode: 200, headers: {} }, 86_400_000);
    expect(await client.pttl(key)).toBeGreaterThan(86_000_000);
  });

  it('tells a waiter the lease Redis keeps, even when the holder\'s clock is behind', async () => {
    const store = new RedisIdempotencyStore(client);
    const key = `skew:${randomUUID()}`;
    // A holder whose clock runs 10 s behind: its recorded lease end is already past here.
    await client.set(key, encodeProcessing('holder', 'fp', Date.now() - 10_000), 'PX', 5_000);
    const waiting = await store.claim({ key, token: 'w', fingerprint: 'fp', leaseMs: 5_000, wait: true });
    expect(waiting).toMatchObject({ status: 'in_progress' });
    expect(waiting.status === 'in_progress' && waiting.retryAfterMs).toBeGreaterThan(4_000);
  });

  it('fences stale owners: over 1,000 trials no late completion or release overwrites the new owner', async () => {
    const store = new RedisIdempotencyStore(client);
    const keys = Array.from({ length: 1000 }, () => `fence:${randomUUID()}`);
    const claimAll = (token: string, leaseMs: number) =>
      Promise.all(keys.map((key) => store.claim({ key, token, fingerprint: '', leaseMs })));
    expect((await claimAll('stale', 100)).every((r) => r.status === 'acquired')).toBe(true);
    await sleep(150); // every stale lease runs out (Redis expiry under test)
    expect((await claimAll('fresh', 60_000)).every((r) => r.status === 'acquired')).toBe(true);
    const late = { statusCode: 200, headers: {}, body: '"stale"' };
    const completed = await Promise.all(keys.map((key) => store.complete(key, 'stale', late, 60_000)));
    const released = await Promise.all(keys.map((key) => store.release(key, 'stale')));
    expect(completed.filter(Boolean)).toHaveLength(0);
    expect(released.filter(Boolean)).toHaveLength(0);
    const owners = await Promise.all(keys.map((key) => store.get(key)));
    expect(owners.filter((r) => r?.state === 'processing' && r.token === 'fresh')).toHaveLength(1000);
  });

  it('renews in one script: Redis sets the new lease, the head gets the new lease end, a waiter\'s mark stays', async () => {
    const store = new RedisIdempotencyStore(client);
    const key = `renew:${randomUUID()}`;
    await store.claim({ key, token: 't', fingerprint: 'fp', leaseMs: 1_000 });
    await store.claim({ key, token: 'w', fingerprint: 'fp', leaseMs: 1_000, wait: true });
    await store.renew(`warm:${randomUUID()}`, 't', 1_000); // loads the script: EVALSHA from here on
    const sent: string[] = [];
    const monitor = await client.monitor();
    monitor.on('monitor', (_time: string, args: string[], source: string) => {
      if (source !== 'lua' && args.includes(key)) sent.push(args[0].toLowerCase());
    });
    expect(await store.renew(key, 't', 60_000)).toBe(true);
    await sleep(50);
    monitor.disconnect();
    expect(sent).toEqual(['evalsha']);
    expect(await client.pttl(key)).toBeGreaterThan(59_000);
    const value = (await client.get(key))!;
    // Still marked by the waiter, so the completion below publishes the key.
    expect(value[0]).toBe('W');
    const record = decodeRecord(value);
    expect(record).toMatchObject({ state: 'processing', token: 't', fingerprint: 'fp' });
    expect(record.state === 'processing' && record.leaseEndMs).toBeGreaterThan(Date.now() + 59_000);
    expect((await store.claim({ key, token: 'u', fingerprint: 'fp', leaseMs: 60_000 })).status).toBe('in_progress');
  });

  it('fences stale renewals: over 1,000 trials no late renewal extends the new owner\'s lease', async () => {
    const store = new RedisIdempotencyStore(client);
    const keys = Array.from({ length: 1000 }, () => `renew-fence:${randomUUID()}`);
    const claimAll = (token: string, leaseMs: number) =>
      Promise.all(keys.map((key) => store.claim({ key, token, fingerprint: '', leaseMs })));
    expect((await claimAll('stale', 100)).every((r) => r.status === 'acquired')).toBe(true);
    await sleep(150); // every stale lease runs out (Redis expiry under test)
    expect((await claimAll('fresh', 5_000)).every((r) => r.status === 'acquired')).toBe(true);
    const renewed = await Promise.all(keys.map((key) => store.renew(key, 'stale', 600_000)));
    expect(renewed.filter(Boolean)).toHaveLength(0);
    const pttls = await Promise.all(keys.map((key) => client.pttl(key)));
    expect(pttls.filter((pttl) => pttl > 0 && pttl <= 5_000)).toHaveLength(1000);
  });

  it('keeps working after SCRIPT FLUSH (EVALSHA falls back to EVAL)', async () => {
    const store = new RedisIdempotencyStore(client);
    const key = `flush:${randomUUID()}`;
    expect((await store.claim({ key, token: 't', fingerprint: '', leaseMs: 1000 })).status).toBe('acquired');
    await client.script('FLUSH');
    expect(await store.complete(key, 't', { statusCode: 200, headers: {} }, 1000)).toBe(true);
  });

  it('claims or replays in one command per call', async () => {
    const store = new RedisIdempotencyStore(client);
    const key = `count:${randomUUID()}`;
    const warm = `warm:${randomUUID()}`;
    await store.claim({ key: warm, token: 't', fingerprint: '', leaseMs: 1000 });
    await store.complete(warm, 't', { statusCode: 200, headers: {} }, 1000);
    await store.release(warm, 't');
    const sent: string[] = [];
    const monitor = await client.monitor();
    monitor.on('monitor', (_time: string, args: string[], source: string) => {
      if (source !== 'lua' && args.includes(key)) sent.push(args[0].toLowerCase());
    });
    await store.claim({ key, token: 't', fingerprint: '', leaseMs: 1000 });
    await store.complete(key, 't', { statusCode: 200, headers: {}, body: '1' }, 1000);
    await store.claim({ key, token: 'u', fingerprint: '', leaseMs: 1000 });
    await sleep(50);
    monitor.disconnect();
    // The claims are plain SET NX GET commands, no script; completing is one script.
    expect(sent).toEqual(['set', 'evalsha', 'set']);
  });
});
