import { afterEach, describe, expect, it, jest } from '@jest/globals';
import { Logger } from '@nestjs/common';
import { Redis as RedisClient, type Redis } from 'ioredis';
import { connectRedis } from '../../../../../test/support/services.js';
import { freePort, startRedisServer, type RedisServer } from '../../../../../test/support/redis-server.js';
import { eventually } from '../../../../../test/support/eventually.js';
import { RedisIdempotencyStore } from './redis-idempotency.store.js';

// Each case runs a redis-server of its own (the policy under test), gone after it.
let server: RedisServer | undefined;
let client: Redis | undefined;
afterEach(async () => {
  client?.disconnect();
  await server?.kill();
  client = server = undefined;
  jest.restoreAllMocks();
});

/**
 * A Redis that evicts keys under memory pressure deletes records and running claims: the next
 * duplicate finds nothing and runs the handler again, with no error anywhere. The store says so
 * when it starts.
 */
describe('RedisIdempotencyStore on a Redis that may evict its keys', () => {

  const warningsAtStart = async (args: string[]) => {
    server = await startRedisServer(undefined, args);
    client = await connectRedis(server.url);
    const warn = jest.spyOn(Logger.prototype, 'warn').mockImplementation(() => undefined);
    await new RedisIdempotencyStore(client).onModuleInit();
    return warn.mock.calls.map(([message]) => String(message));
  };

  it.each(['allkeys-lru', 'volatile-lru', 'allkeys-random', 'volatile-ttl', 'allkeys-lfu'])(
    'warns at start-up under maxmemory-policy %s, naming the policy and noeviction',
    async (policy) => {
      const warnings = await warningsAtStart(['--maxmemory', '64mb', '--maxmemory-policy', policy]);
      expect(warnings.filter((w) => w.includes(policy) && w.includes('noeviction'))).toHaveLength(1);
    },
  );

  it('warns once Redis comes up, when it was not ready at start-up', async () => {
    const port = await freePort();
    client = new RedisClient(`redis://127.0.0.1:${port}`, { lazyConnect: true, maxRetriesPerRequest: 0, retryStrategy: () => 100 });
    client.on('error', () => undefined);
    const warn = jest.spyOn(Logger.prototype, 'warn').mockImplementation(() => undefined);
    await new RedisIdempotencyStore(client, { readyTimeoutMs: 100 }).onModuleInit();
    server = await startRedisServer(port, ['--maxmemory', '64mb', '--maxmemory-policy', 'allkeys-lru']);
    await eventually(() => warn.mock.calls.some(([message]) => String(message).includes('allkeys-lru')), { timeoutMs: 5000 });
  });

  it.each([
    ['noeviction with a maxmemory', ['--maxmemory', '64mb', '--maxmemory-policy', 'noeviction']],
    ['an evicting policy without a maxmemory (it never evicts)', ['--maxmemory', '0', '--maxmemory-policy', 'allkeys-lru']],
  ])('says nothing under %s', async (_what, args) => {
    const warnings = await warningsAtStart(args);
    expect(warnings.filter((w) => w.includes('maxmemory'))).toEqual([]);
  });
});

/**
 * Under noeviction, a Redis at its maxmemory refuses every write with OOM, and the claim (SET NX
 * GET) is a write even when it would only read a completed record. Reads still work: a replay
 * must not turn into an outage (under the default fail-open, a second run of a completed call).
 */
describe('RedisIdempotencyStore on a Redis at its maxmemory (noeviction)', () => {

  it('still answers a claim of a completed or running key from the record, refuses a new key, and lets a running claim finish', async () => {
    server = await startRedisServer(undefined, ['--maxmemory', '4mb', '--maxmemory-policy', 'noeviction']);
    client = await connectRedis(server.url);
    const store = new RedisIdempotencyStore(client);
    const claim = (key: string, token: string) => store.claim({ key, token, fingerprint: 'f', leaseMs: 60_000 });
    await claim('done', 't1');
    await store.complete('done', 't1', { statusCode: 201, headers: {}, body: '{"id":1}' }, 60_000);
    await claim('running', 't2');
    // Fill the rest of its memory with the app's own keys, big then small, until it refuses
    // even a small write.
    for (const size of [64 * 1024, 1024, 16]) {
      const filler = 'x'.repeat(size);
      for (let i = 0; ; i++) {
        try {
          await client.set(`filler:${size}:${i}`, filler);
        } catch (error) {
          expect(String(error)).toMatch(/OOM/);
          break;
        }
      }
    }
    expect(await claim('done', 't3')).toEqual({ status: 'completed', response: { statusCode: 201, headers: {}, body: '{"id":1}' } });
    expect(await claim('running', 't4')).toMatchObject({ status: 'in_progress' });
    await expect(claim('new', 't5')).rejects.toThrow(/OOM/);
    // The claim Redis took finishes: it renews, and its answer is saved and replayed. Refused,
    // the handler's success was lost, and a retry ran it again after the lease (found by an
    // adversarial helper).
    const answer = { statusCode: 201, headers: {}, body: JSON.stringify({ id: 2, note: 'y'.repeat(4096) }) };
    expect(await store.renew('running', 't2', 60_000)).toBe(true);
    expect(await store.complete('running', 't2', answer, 60_000)).toBe(true);
    expect(await claim('running', 't6')).toEqual({ status: 'completed', response: answer });
  });
});
