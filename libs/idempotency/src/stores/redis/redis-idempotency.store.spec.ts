import { afterAll, beforeAll, describe, expect, it, jest } from '@jest/globals';
import { Logger } from '@nestjs/common';
import { Redis, type RedisOptions } from 'ioredis';
import { randomUUID } from 'node:crypto';
import { connectRedis, REDIS_URL } from '../../../../../test/support/services.js';
import { TcpProxy } from '../../../../../test/support/tcp-proxy.js';
import { eventually } from '../../../../../test/support/eventually.js';
import { startRedisServer } from '../../../../../test/support/redis-server.js';
import { describeStoreContract } from '../../testing/index.js';
import { createStore, REDIS_CLIENT_DEFAULTS } from '../create-store.js';
import { RedisIdempotencyStore } from './redis-idempotency.store.js';
import { IdempotencyNotARecordError } from '../../errors/idempotency.errors.js';
import { decodeRecord, encodeProcessing } from './redis-record.js';

const sleep = (ms: number) => new Promise<void>((resolve) => setTimeout(resolve, ms));

// Clients as apps hand them in, each through the whole contract:
// - the app's own keyPrefix: the scripts then publish prefixed keys, which the store's watchers
//   must still hear (a waiting duplicate otherwise sleeps to its bound: 409);
// - `stringNumbers` (integer replies as strings, for 64-bit counters): a renewal that succeeded
//   was read as failed, the lease stopped, and a duplicate ran the handler again.
describe.each<[string, RedisOptions]>([
  ['keyPrefix', { keyPrefix: 'app-prefix:' }],
  ['stringNumbers', { stringNumbers: true }],
])('RedisIdempotencyStore on a client with %s', (name, options) => {
  let client: Redis;
  beforeAll(async () => {
    client = await connectRedis(REDIS_URL, options);
  });
  afterAll(async () => {
    await client.quit();
  });

  describeStoreContract(
    `redis (${name})`,
    async () => {
      const store = new RedisIdempotencyStore(client);
      return { store, elapse: sleep, close: () => store.onApplicationShutdown() };
    },
    // A few round trips must fit in one lease: 200 ms did not on a loaded CI machine.
    500,
  );
});

// A client of ioredis's defaults re-sends a command whose reply a dropped connection lost: Redis
// runs it twice. An adversarial helper: the claim found its own record and answered 409, and the
// key's only request was refused, the key held for a lease with nothing running; a completion
// found its own saved record and reported it not saved.
describe('RedisIdempotencyStore on a client of ioredis defaults whose connection drops with a reply on its way', () => {
  let proxy: TcpProxy;
  let client: Redis;
  beforeAll(async () => {
    const { hostname, port } = new URL(REDIS_URL);
    proxy = await new TcpProxy({ host: hostname, port: Number(port || 6379) }).start();
    client = new Redis(proxy.url);
    client.on('error', () => undefined);
    await client.ping();
  });
  afterAll(async () => {
    client.disconnect();
    await proxy.stop();
  });

  it('takes its own claim, sent again, as acquired', async () => {
    const store = new RedisIdempotencyStore(client);
    const key = `resent-claim:${randomUUID()}`;
    const dropped = proxy.droppedResponses;
    proxy.dropNextResponse();
    expect(await store.claim({ key, token: 't', fingerprint: 'fp', leaseMs: 10_000 })).toEqual({ status: 'acquired', token: 't' });
    expect(proxy.droppedResponses).toBe(dropped + 1);
    expect(await store.complete(key, 't', { statusCode: 201, headers: {}, body: '{}' }, 60_000)).toBe(true);
    expect(await store.claim({ key, token: 'u', fingerprint: 'fp', leaseMs: 10_000 })).toMatchObject({ status: 'completed' });
  });

  it('takes its own completion, sent again, as saved; another owner\'s completed record is still refused', async () => {
    const store = new RedisIdempotencyStore(client);
    const key = `resent-complete:${randomUUID()}`;
    await store.claim({ key, token: 't', fingerprint: 'fp', leaseMs: 10_000 });
    const dropped = proxy.droppedResponses;
    proxy.dropNextResponse();
    expect(await store.complete(key, 't', { statusCode: 201, headers: {}, body: '{}' }, 60_000)).toBe(true);
    expect(proxy.droppedResponses).toBe(dropped + 1);
    expect(await store.complete(key, 'other', { statusCode: 201, headers: {}, body: '{"x":1}' }, 60_000)).toBe(false);
    expect(await store.release(key, 't')).toBe(false);
    expect(await store.get(key)).toMatchObject({ state: 'completed', response: { body: '{}' } });
  });
});

// An adversarial helper: the completion script wrote the record, then failed on PUBLISH (NOPERM),
// so every save of such a user counted as failed, and the release of a waited-for key too.
it('saves and releases for a user whose ACL refuses PUBLISH (waiters then sleep to their bound)', async () => {
  const server = await startRedisServer();
  const admin = await connectRedis(server.url);
  try {
    await admin.call('ACL', 'SETUSER', 'nopublish', 'on', 'nopass', '~*', '&*', '+@all', '-publish');
    const limited = await connectRedis(server.url, { username: 'nopublish', password: 'any' });
    const store = new RedisIdempotencyStore(limited);
    try {
      for (const settle of ['complete', 'release'] as const) {
        const key = `nopublish:${settle}`;
        await store.claim({ key, token: 't', fingerprint: '', leaseMs: 10_000 });
        // A waiting duplicate marks the record: its settling publishes the key.
        expect(await store.claim({ key, token: 'w', fingerprint: '', leaseMs: 10_000, wait: true })).toMatchObject({ status: 'in_progress' });
        const settled = settle === 'complete' ? store.complete(key, 't', { statusCode: 201, headers: {} }, 60_000) : store.release(key, 't');
        expect(await settled).toBe(true);
        expect((await store.get(key))?.state).toBe(settle === 'complete' ? 'completed' : undefined);
      }
    } finally {
      limited.disconnect();
    }
  } finally {
    admin.disconnect();
    await server.kill();
  }
});

// An adversarial helper: the store's subscriber inherited a client's `autoResubscribe: false`, and
// after any reconnect no waiter was woken again (each slept to its bound).
it("wakes waiters after its subscriber reconnects, on a client with autoResubscribe: false", async () => {
  const server = await startRedisServer();
  const admin = await connectRedis(server.url);
  const client = new Redis(server.url, { autoResubscribe: false, maxRetriesPerRequest: 0, retryStrategy: () => 20 });
  client.on('error', () => undefined);
  try {
    const store = new RedisIdempotencyStore(client);
    await (await store.watch('warm')).cancel();
    await admin.call('CLIENT', 'KILL', 'TYPE', 'pubsub');
    // Subscribed again on its new connection (before the fix: connected, and subscribed to nothing).
    await eventually(async () => Number(((await admin.call('PUBSUB', 'NUMSUB', 'idempotency:settled')) as [string, number])[1]) === 1, { timeoutMs: 5000 });
    await store.claim({ key: 'resubscribed', token: 't', fingerprint: '', leaseMs: 10_000 });
    await store.claim({ key: 'resubscribed', token: 'w', fingerprint: '', leaseMs: 10_000, wait: true });
    const watch = await store.watch('resubscribed');
    await store.complete('resubscribed', 't', { statusCode: 201, headers: {} }, 60_000);
    expect(await Promise.race([watch.settled.then(() => 'woken'), sleep(2000).then(() => 'slept')])).toBe('woken');
    await store.onApplicationShutdown();
  } finally {
    client.disconnect();
    admin.disconnect();
    await server.kill();
  }
});

// An adversarial helper: a user whose ACL refuses scripts claimed keys (a plain SET), and then
// every save and renewal failed: each key ran again once a lease ended, with nothing said.
// helper-212: the check ran a script on a key outside the guard's prefix, so a user narrowed to
// it (as the README allows) was told its scripts were refused, while a user that may not SET, or
// whose keys leave the prefix out, was told "claims land": none did, and under fail-open every
// duplicate ran. helper-213: a store handed to the module as an instance probed under the default
// prefix (a false alarm for a user narrowed to the module's keyPrefix).
// (Every row has all five: jest hands a test of more parameters than its row a done callback.)
it.each<[string, string[], string | undefined, RegExp | undefined, boolean]>([
  ['narrowed to the guard\'s prefix', ['~no_repeat:*', '&*', '+@all'], undefined, undefined, false],
  ['narrowed to a module keyPrefix of its own', ['~svc:*', '&*', '+@all'], 'svc', undefined, false],
  ['narrowed to the module keyPrefix, its store handed to the module', ['~myapp:*', '&*', '+@all'], 'myapp', undefined, true],
  ['without SET', ['~*', '&*', '+@all', '-set'], undefined, /may not claim the guard's keys .*no_repeat:/, false],
  ['whose keys leave the prefix out', ['~other:*', '&*', '+@all'], undefined, /may not claim the guard's keys .*no_repeat:/, false],
  ['without scripts', ['~*', '&*', '+@all', '-@scripting'], undefined, /may not run the guard's scripts/, false],
])('says at start-up what a Redis user %s may not do, and nothing when it may do all', async (_what, rules, keyPrefix, said, handed) => {
  const server = await startRedisServer();
  const admin = await connectRedis(server.url);
  const errors = jest.spyOn(Logger.prototype, 'error').mockImplementation(() => undefined);
  try {
    await admin.call('ACL', 'SETUSER', 'limited', 'on', 'nopass', ...rules);
    const limited = await connectRedis(server.url, { username: 'limited', password: 'any' });
    try {
      const store = handed ? await createStore({ store: new RedisIdempotencyStore(limited), keyPrefix }) : new RedisIdempotencyStore(limited, { keyPrefix });
      await (store as RedisIdempotencyStore).onModuleInit();
      const messages = errors.mock.calls.map(([message]) => String(message));
      if (said) expect(messages).toEqual([expect.stringMatching(said)]);
      else expect(messages).toEqual([]);
      // The probe leaves no key behind.
      expect(await admin.keys('*')).toEqual([]);
    } finally {
      limited.disconnect();
    }
  } finally {
    errors.mockRestore();
    admin.disconnect();
    await server.kill();
  }
});

// helper-213: a Redis that refuses every claim as a read-only replica or at its maxmemory said
// nothing at start-up, while fail-open ran everything.
it.each([
  ['a read-only replica', async () => {
    const primary = await startRedisServer();
    const replica = await startRedisServer(undefined, ['--replicaof', '127.0.0.1', new URL(primary.url).port]);
    return { url: replica.url, kill: async () => void (await Promise.all([replica.kill(), primary.kill()])) };
  }, /refuses the guard's claims \(.*READONLY/],
  // helper-216: min-replicas-to-write not met refuses writes with NOREPLICAS.
  ['a primary short of its min-replicas-to-write', async () => {
    const server = await startRedisServer(undefined, ['--min-replicas-to-write', '1']);
    return { url: server.url, kill: () => server.kill() };
  }, /refuses the guard's claims \(.*NOREPLICAS/],
  ['a Redis at its maxmemory (noeviction)', async () => {
    const server = await startRedisServer(undefined, ['--maxmemory', '1', '--maxmemory-policy', 'noeviction']);
    return { url: server.url, kill: () => server.kill() };
  }, /refuses the guard's claims \(.*OOM/],
])('says at start-up that %s refuses claims', async (_what, start, said) => {
  const server = await start();
  const client = await connectRedis(server.url);
  const errors = jest.spyOn(Logger.prototype, 'error').mockImplementation(() => undefined);
  try {
    await new RedisIdempotencyStore(client).onModuleInit();
    expect(errors.mock.calls.map(([message]) => String(message))).toEqual([expect.stringMatching(said)]);
  } finally {
    errors.mockRestore();
    client.disconnect();
    await server.kill();
  }
});

// Whether a failed call may still land: the guard then keeps trying a fail-open run's save (see
// guard-edge-fail-open-lease). Read from the client's options; no connection is made.
describe('RedisIdempotencyStore.deliversLate', () => {
  it.each<[string, RedisOptions, boolean]>([
    ["ioredis's defaults (an offline queue, unanswered commands sent again)", {}, true],
    ['no offline queue, but unanswered commands sent again and kept for 20 reconnects', { enableOfflineQueue: false }, true],
    ['no offline queue, unanswered commands dropped at the first reconnect', { enableOfflineQueue: false, maxRetriesPerRequest: 0 }, false],
    ['no offline queue, unanswered commands never sent again', { enableOfflineQueue: false, autoResendUnfulfilledCommands: false }, false],
    ["the module's own client (REDIS_CLIENT_DEFAULTS)", REDIS_CLIENT_DEFAULTS, false],
  ])('%s', (_name, options, late) => {
    const client = new Redis({ ...options, lazyConnect: true });
    expect(new RedisIdempotencyStore(client).deliversLate).toBe(late);
    client.disconnect();
  });
});

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
      // The app's own value under the key: a string starting with C, as a completed record does.
      const writeForeignValue = async (key: string) => {
        await client.set(key, 'Canada', 'PX', 60_000);
        return async () => (await client.get(key)) === 'Canada';
      };
      return { store, elapse: sleep, close: () => store.onApplicationShutdown(), writeForeignValue };
    },
    // A few round trips must fit in one lease: 200 ms did not on a loaded CI machine.
    500,
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
    // Leases of seconds, so that a stall of a loaded machine cannot end them before the renewal.
    await store.claim({ key, token: 't', fingerprint: 'fp', leaseMs: 5_000 });
    await store.claim({ key, token: 'w', fingerprint: 'fp', leaseMs: 5_000, wait: true });
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
    expect(await client.pttl(key)).toBeGreaterThan(30_000);
    const value = (await client.get(key))!;
    // Still marked by the waiter, so the completion below publishes the key.
    expect(value[0]).toBe('W');
    const record = decodeRecord(value);
    expect(record).toMatchObject({ state: 'processing', token: 't', fingerprint: 'fp' });
    expect(record.state === 'processing' && record.leaseEndMs).toBeGreaterThan(Date.now() + 30_000);
    expect((await store.claim({ key, token: 'u', fingerprint: 'fp', leaseMs: 60_000 })).status).toBe('in_progress');
  });

  it('fences stale renewals: over 1,000 trials no late renewal extends the new owner\'s lease', async () => {
    const store = new RedisIdempotencyStore(client);
    const keys = Array.from({ length: 1000 }, () => `renew-fence:${randomUUID()}`);
    const claimAll = (token: string, leaseMs: number) =>
      Promise.all(keys.map((key) => store.claim({ key, token, fingerprint: '', leaseMs })));
    expect((await claimAll('stale', 100)).every((r) => r.status === 'acquired')).toBe(true);
    await sleep(150); // every stale lease runs out (Redis expiry under test)
    expect((await claimAll('fresh', 60_000)).every((r) => r.status === 'acquired')).toBe(true);
    const renewed = await Promise.all(keys.map((key) => store.renew(key, 'stale', 600_000)));
    expect(renewed.filter(Boolean)).toHaveLength(0);
    const pttls = await Promise.all(keys.map((key) => client.pttl(key)));
    expect(pttls.filter((pttl) => pttl > 0 && pttl <= 60_000)).toHaveLength(1000);
  });

  it('forgets in one script: a waiter-marked claim is refused and kept', async () => {
    const store = new RedisIdempotencyStore(client);
    const marked = `forget-marked:${randomUUID()}`;
    await store.claim({ key: marked, token: 't', fingerprint: 'fp', leaseMs: 60_000 });
    await store.claim({ key: marked, token: 'w', fingerprint: 'fp', leaseMs: 60_000, wait: true });
    expect((await client.get(marked))![0]).toBe('W');
    await store.forget(`warm:${randomUUID()}`); // loads the script: EVALSHA from here on
    const sent: string[] = [];
    const monitor = await client.monitor();
    monitor.on('monitor', (_time: string, args: string[], source: string) => {
      if (source !== 'lua' && args.includes(marked)) sent.push(args[0].toLowerCase());
    });
    expect(await store.forget(marked)).toEqual({ forgotten: false, reason: 'in_progress' });
    await sleep(50);
    monitor.disconnect();
    expect(sent).toEqual(['evalsha']);
    expect(decodeRecord((await client.get(marked))!)).toMatchObject({ state: 'processing', token: 't' });
  });

  it('forgets only a whole record: the app\'s strings that start like one, and keys of other types, are not_a_record and kept', async () => {
    const store = new RedisIdempotencyStore(client);
    // The last three start as records do, and read as none (inspect: not_a_record); forget deleted
    // them, and answered in_progress for the P one (a reviewing helper).
    const strings = ['Canada', 'C', 'C[', 'C["x"]', 'C["x"]\nno meta', 'P', 'Pizza', 'W', 'Waffle', 'not a record', '', 'C["a",""]\n[200,null]', 'P["x","f"]', 'W["x"]'];
    for (const value of strings) {
      const key = `forget-foreign:${randomUUID()}`;
      await client.set(key, value, 'PX', 60_000);
      expect({ value, result: await store.forget(key) }).toEqual({ value, result: { forgotten: false, reason: 'not_a_record' } });
      expect(await client.get(key)).toBe(value);
    }
    const others: [string, (key: string) => Promise<unknown>, (key: string) => Promise<unknown>][] = [
      ['hash', (key) => client.hset(key, 'a', '1'), (key) => client.hgetall(key)],
      ['list', (key) => client.rpush(key, 'C["x"]'), (key) => client.lrange(key, 0, -1)],
      ['set', (key) => client.sadd(key, 'C'), (key) => client.smembers(key)],
    ];
    for (const [type, write, read] of others) {
      const key = `forget-${type}:${randomUUID()}`;
      await write(key);
      const before = await read(key);
      expect({ type, result: await store.forget(key) }).toEqual({ type, result: { forgotten: false, reason: 'not_a_record' } });
      // Read, the key of another type is a clear "not a record", not a bare WRONGTYPE.
      await expect(store.get(key)).rejects.toBeInstanceOf(IdempotencyNotARecordError);
      expect(await read(key)).toEqual(before);
      await client.del(key);
    }
    // A completed record with an empty head field and no body is still one, and is forgotten.
    const key = `forget-whole:${randomUUID()}`;
    await store.claim({ key, token: 't', fingerprint: '', leaseMs: 60_000 });
    expect(await store.complete(key, 't', { statusCode: 204, headers: {} }, 60_000)).toBe(true);
    expect(await store.forget(key)).toEqual({ forgotten: true });
    expect(await client.exists(key)).toBe(0);
  });

  it('keeps working after SCRIPT FLUSH (EVALSHA falls back to EVAL)', async () => {
    const store = new RedisIdempotencyStore(client);
    const key = `flush:${randomUUID()}`;
    expect((await store.claim({ key, token: 't', fingerprint: '', leaseMs: 60_000 })).status).toBe('acquired');
    await client.script('FLUSH');
    expect(await store.complete(key, 't', { statusCode: 200, headers: {} }, 1000)).toBe(true);
  });

  // A command's bound is a timer. After the process stalls past it (a GC pause, a CPU-starved
  // container), Node runs due timers before it reads its sockets: an answer Redis sent in time
  // must still win over the bound, on the module's own client and on one the app hands in.
  describe.each([
    ['the client the module opens from a URL', async () => (await createStore({ store: { redis: REDIS_URL } })) as RedisIdempotencyStore],
    ['a client handed in with no commandTimeout', async () => new RedisIdempotencyStore(await connectRedis(REDIS_URL, { commandTimeout: undefined }), { ownsClient: true })],
    // Found by an adversarial helper: ioredis's auto-pipelining sends a turn's commands in a
    // setImmediate, and the bound counted a stall before that send against Redis.
    [
      'a client handed in with enableAutoPipelining',
      async () => new RedisIdempotencyStore(await connectRedis(REDIS_URL, { commandTimeout: undefined, enableAutoPipelining: true }), { ownsClient: true }),
    ],
  ])('on %s', (_name, open) => {
    it('takes an answer that arrived while the process stalled past the bound', async () => {
      const store = await open();
      await store.onModuleInit();
      try {
        const key = `stall:${randomUUID()}`;
        const claimed = store.claim({ key, token: 't', fingerprint: '', leaseMs: 5000 });
        const stallUntil = Date.now() + 1300;
        while (Date.now() < stallUntil); // the stall: no timer and no socket is served meanwhile
        expect(await claimed).toEqual({ status: 'acquired', token: 't' });
      } finally {
        await store.onApplicationShutdown();
      }
    });

    // A command called in a turn of the check phase (as a setImmediate callback is) and a stall
    // in that turn: a client that sends at the turn's end (write coalescing, ioredis's
    // auto-pipelining) sends it in the next check phase, after the timers that come due first.
    it('takes the answer to a command sent after a stall of the turn that called it', async () => {
      const store = await open();
      await store.onModuleInit();
      try {
        const key = `stall-turn:${randomUUID()}`;
        const claimed = await new Promise<Promise<unknown>>((resolve) =>
          setImmediate(() => {
            const claim = store.claim({ key, token: 't', fingerprint: '', leaseMs: 5000 });
            const stallUntil = Date.now() + 1300;
            while (Date.now() < stallUntil);
            resolve(claim);
          }),
        );
        expect(await claimed).toEqual({ status: 'acquired', token: 't' });
      } finally {
        await store.onApplicationShutdown();
      }
    });

    // Found by an adversarial helper: a large answer (a replay's saved body) does not fit in the
    // socket's receive buffer. After a stall the first read takes only a part; the rest comes as
    // Redis can send it, after the bound's one turn of grace. A fail-open route ran its handler
    // again for a key already completed.
    it('takes a large answer that was coming in when the process stalled past the bound', async () => {
      const store = await open();
      await store.onModuleInit();
      try {
        const key = `stall-large:${randomUUID()}`;
        const body = 'x'.repeat(900 * 1024);
        await store.claim({ key, token: 't', fingerprint: 'fp', leaseMs: 5000 });
        expect(await store.complete(key, 't', { statusCode: 200, headers: {}, body }, 60_000)).toBe(true);
        const replayed = store.claim({ key, token: 'u', fingerprint: 'fp', leaseMs: 5000 });
        // The stall starts once the command went out (after the turn's writes), as a busy app's would.
        await new Promise<void>((resolve) =>
          setImmediate(() => {
            const stallUntil = Date.now() + 1300;
            while (Date.now() < stallUntil);
            resolve();
          }),
        );
        const result = await replayed;
        expect(result.status === 'completed' && result.response.body?.length).toBe(body.length);
      } finally {
        await store.onApplicationShutdown();
      }
    });
  });

  // The module's client sends a turn's commands together when the turn ends (coalesceWrites). A
  // stall of the process after the call and before that send must not count against Redis: the
  // bound starts when the command leaves (here Redis answers 20 ms after the stall, through a
  // proxy; the bound armed at the call ran out during the stall and failed the claim).
  it('counts the bound from when the module\'s client sent the command, not from the call', async () => {
    const [host, port] = REDIS_URL.replace('redis://', '').split(':');
    const proxy = await new TcpProxy({ host, port: Number(port) }).start();
    const store = (await createStore({ store: { redis: proxy.url } })) as RedisIdempotencyStore;
    await store.onModuleInit();
    try {
      proxy.delayMs = 10;
      const key = `stall-send:${randomUUID()}`;
      const claimed = store.claim({ key, token: 't', fingerprint: '', leaseMs: 5000 });
      const stallUntil = Date.now() + 1300;
      while (Date.now() < stallUntil); // the call was made; its command waits for the turn's end
      expect(await claimed).toEqual({ status: 'acquired', token: 't' });
    } finally {
      proxy.delayMs = 0;
      await store.onApplicationShutdown();
      await proxy.stop();
    }
  });

  it('bounds a watch (the subscriber\'s SUBSCRIBE) on the module\'s own client when Redis turns slow', async () => {
    const [host, port] = REDIS_URL.replace('redis://', '').split(':');
    const proxy = await new TcpProxy({ host, port: Number(port) }).start();
    const store = (await createStore({ store: { redis: proxy.url } })) as RedisIdempotencyStore;
    await store.onModuleInit();
    try {
      proxy.delayMs = 5000;
      const started = Date.now();
      await expect(store.watch(`slow:${randomUUID()}`)).rejects.toThrow(/subscribe failed: no answer within 1000 ms/);
      expect(Date.now() - started).toBeLessThan(3000);
    } finally {
      proxy.delayMs = 0;
      await store.onApplicationShutdown();
      await proxy.stop();
    }
  });

  // Found by an adversarial helper: with Redis paused (SIGSTOP), app.close() hung until Redis
  // came back (QUIT was bounded by nothing once the module's client had no commandTimeout).
  it('shuts down within the bound when Redis went silent (the module\'s client and the subscriber)', async () => {
    const server = await startRedisServer();
    const store = (await createStore({ store: { redis: server.url } })) as RedisIdempotencyStore;
    await store.onModuleInit();
    (await store.watch(`quit:${randomUUID()}`)).cancel();
    server.process.kill('SIGSTOP');
    try {
      const started = Date.now();
      await store.onApplicationShutdown();
      expect(Date.now() - started).toBeLessThan(2500);
    } finally {
      server.process.kill('SIGCONT');
      await server.kill();
    }
  });

  // Found by an adversarial helper: each failed SUBSCRIBE (here an ACL without channels, Redis
  // 7's default for a new user) added listeners again on the one subscriber connection.
  it('keeps one listener per event on its subscriber however many SUBSCRIBEs fail', async () => {
    const server = await startRedisServer();
    const admin = await connectRedis(server.url);
    await admin.call('ACL', 'SETUSER', 'app', 'on', '>pw', '~*', '+@all', 'resetchannels');
    const { port } = new URL(server.url);
    const store = (await createStore({ store: { redis: `redis://app:pw@127.0.0.1:${port}` } })) as RedisIdempotencyStore;
    await store.onModuleInit();
    try {
      for (let i = 0; i < 12; i++) await expect(store.watch(`acl:${i}`)).rejects.toThrow(/NOPERM/);
      const subscriber = (store as unknown as { subscriber: Redis }).subscriber;
      expect([subscriber.listenerCount('message'), subscriber.listenerCount('error')]).toEqual([1, 1]);
    } finally {
      await store.onApplicationShutdown();
      admin.disconnect();
      await server.kill();
    }
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
