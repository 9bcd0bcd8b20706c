// A replay answered by the local cache (`localCache`) must never be stale.
// Each test changes a record the cache holds, from outside the guard (DEL, SET, PEXPIRE, flushes,
// a restart, a failover-like reconnect), then checks what the next duplicate gets.
import { afterAll, afterEach, beforeAll, describe, expect, it } from '@jest/globals';
import { Body, Controller, Post, type INestApplication } from '@nestjs/common';
import { Redis } from 'ioredis';
import { randomUUID } from 'node:crypto';
import { createConnection, createServer, type Server, type Socket } from 'node:net';
import {
  IdempotencyAdmin,
  IdempotencyStore,
  LocalCacheIdempotencyStore,
  NoRepeatSubmit,
  type IdempotencyModuleOptions,
} from 'nestjs-idempotency';
import { eventually } from './support/eventually.js';
import { freePort, startRedisServer, type RedisServer } from './support/redis-server.js';
import { REDIS_URL } from './support/services.js';
import { makeApp } from './support/edge-app.js';
import { TcpProxy } from './support/tcp-proxy.js';

/** Handler runs per client key, across every app of this file. */
const runs = new Map<string, number>();

@Controller('probe')
class ProbeController {
  @Post('long')
  @NoRepeatSubmit({ expireSeconds: 600 })
  long(@Body() body: { k: string }) {
    const run = (runs.get(body.k) ?? 0) + 1;
    runs.set(body.k, run);
    return { k: body.k, run };
  }

  /** 3 s: room for a loaded machine to cache the record and replay it before it ends (1 s failed there). */
  @Post('short')
  @NoRepeatSubmit({ expireSeconds: 3 })
  short(@Body() body: { k: string }) {
    const run = (runs.get(body.k) ?? 0) + 1;
    runs.set(body.k, run);
    return { k: body.k, run };
  }
}

type Adapter = 'express' | 'fastify';

interface Instance {
  app: INestApplication;
  url: string;
  admin: IdempotencyAdmin;
  cache: LocalCacheIdempotencyStore;
}

async function start(adapter: Adapter, options: IdempotencyModuleOptions): Promise<Instance> {
  const { app, url } = await makeApp(adapter, [ProbeController], options);
  const cache = app.get(IdempotencyStore);
  expect(cache).toBeInstanceOf(LocalCacheIdempotencyStore);
  return { app, url, admin: app.get(IdempotencyAdmin), cache: cache as LocalCacheIdempotencyStore };
}

interface Answer {
  status: number;
  replayed: boolean;
  run?: number;
  code?: string;
}

async function post(instance: Instance, route: 'long' | 'short', k: string): Promise<Answer> {
  const res = await fetch(`${instance.url}/probe/${route}`, {
    method: 'POST',
    headers: { 'content-type': 'application/json', 'idempotency-key': k },
    body: JSON.stringify({ k }),
  });
  const body = (await res.json()) as { run?: number; code?: string };
  return { status: res.status, replayed: res.headers.get('idempotent-replayed') === 'true', run: body.run, code: body.code };
}

const handlerOf = (route: 'long' | 'short') => `ProbeController.${route}`;

/** The cache holds `storageKey` (a read of its private map, not counted as a use). */
function holds(cache: LocalCacheIdempotencyStore, storageKey: string): boolean {
  return (cache as unknown as { records: { entries: Map<string, unknown> } }).records.entries.has(storageKey);
}

/** Makes a record, replays it once (from Redis), waits until the instance's cache holds it; returns its storage key and first run. */
async function cached(instance: Instance, route: 'long' | 'short', k: string): Promise<{ storageKey: string; run: number }> {
  const first = await post(instance, route, k);
  expect(first).toMatchObject({ status: 201, replayed: false });
  expect(await post(instance, route, k)).toMatchObject({ status: 201, replayed: true, run: first.run });
  const storageKey = instance.admin.storageKeyOf({ user: { anonymous: true }, handler: handlerOf(route), key: k });
  await eventually(() => holds(instance.cache, storageKey), { timeoutMs: 3000, describe: () => `${storageKey} never cached` });
  return { storageKey, run: first.run! };
}

/** Waits until the guard answers from Redis again (fail-open answers 201 while it is down). */
async function storeBack(instance: Instance): Promise<void> {
  await eventually(
    async () => {
      const k = randomUUID();
      await post(instance, 'long', k);
      return (await post(instance, 'long', k)).replayed;
    },
    { timeoutMs: 10_000 },
  );
}

/** Waits a little for an announcement to arrive (a change from another connection is asynchronous). */
const settle = (ms = 100) => new Promise((resolve) => setTimeout(resolve, ms));

/**
 * Until the instance dropped its entry of `storageKey`: the invalidation Redis pushed was heard.
 * Without it the entry would answer until its retention (600 s); 2 s is room for a loaded machine.
 */
const heard = (instance: Instance, storageKey: string) => eventually(() => !holds(instance.cache, storageKey), { timeoutMs: 2000 });

describe('localCache on the shared Redis: external changes of a cached record', () => {
  const keyPrefix = `rvst${randomUUID().slice(0, 8)}`;
  let a: Instance;
  let redis: Redis;

  beforeAll(async () => {
    redis = new Redis(REDIS_URL);
    a = await start('express', { store: { redis: REDIS_URL }, keyPrefix, localCache: true });
  });
  afterAll(async () => {
    await a?.app.close();
    redis?.disconnect();
  });

  it('DEL of the record: the next duplicate runs the handler', async () => {
    const k = randomUUID();
    const { storageKey, run } = await cached(a, 'long', k);
    expect(await post(a, 'long', k)).toMatchObject({ status: 201, replayed: true, run });
    await redis.del(storageKey);
    await heard(a, storageKey);
    expect(await post(a, 'long', k)).toMatchObject({ status: 201, replayed: false, run: run + 1 });
  });

  it('SET of another completed record (another fingerprint) over it: the next duplicate gets 422 as from Redis, never the old answer', async () => {
    const k = randomUUID();
    const other = randomUUID();
    const { storageKey } = await cached(a, 'long', k);
    const { storageKey: otherKey } = await cached(a, 'long', other);
    // The other record's value (fingerprint ''-free: same body shape, other k) copied over this key.
    const value = await redis.get(otherKey);
    await redis.set(storageKey, value!, 'PX', 600_000);
    await heard(a, storageKey);
    const answer = await post(a, 'long', k);
    // The record now holds another fingerprint: Redis would answer 422 (key reused), never the old answer.
    expect(answer).toMatchObject({ status: 422 });
  });

  it('MOVE of the record to another db, RENAME of another key over it: each heard', async () => {
    const k = randomUUID();
    const { storageKey, run } = await cached(a, 'long', k);
    await redis.move(storageKey, 7);
    await heard(a, storageKey);
    expect(await post(a, 'long', k)).toMatchObject({ status: 201, replayed: false, run: run + 1 });
    expect(await post(a, 'long', k)).toMatchObject({ status: 201, replayed: true, run: run + 1 });
    await eventually(() => holds(a.cache, storageKey), { timeoutMs: 3000 });
    await new Redis(`${REDIS_URL}/7`).pipeline().del(storageKey).quit().exec();
    const spare = `${storageKey}:spare`;
    await redis.set(spare, 'x');
    await redis.rename(spare, storageKey);
    await heard(a, storageKey);
    // Not a record: the store cannot read it (fail-open runs the handler), never a replay of the cached one.
    expect(await post(a, 'long', k)).toMatchObject({ replayed: false });
    await redis.del(storageKey);
  });

  it('PEXPIRE shortening the record: once Redis expired it, the next duplicate runs the handler', async () => {
    const k = randomUUID();
    const { storageKey, run } = await cached(a, 'long', k);
    await redis.pexpire(storageKey, 200);
    await settle(400);
    expect(await redis.exists(storageKey)).toBe(0);
    expect(await post(a, 'long', k)).toMatchObject({ status: 201, replayed: false, run: run + 1 });
  });

  it('retention (expireSeconds: 3) ends in the cache no later than in Redis', async () => {
    const k = randomUUID();
    const { run } = await cached(a, 'short', k);
    expect(await post(a, 'short', k)).toMatchObject({ replayed: true, run });
    await settle(3100);
    expect(await post(a, 'short', k)).toMatchObject({ status: 201, replayed: false, run: run + 1 });
  });
});

describe('localCache with a client keyPrefix and a Redis db other than 0', () => {
  const keyPrefix = `rvkp${randomUUID().slice(0, 8)}`;
  const clientPrefix = `cp${randomUUID().slice(0, 6)}:`;
  let a: Instance;
  let redis: Redis;

  beforeAll(async () => {
    redis = new Redis(`${REDIS_URL}/3`);
    const { hostname, port } = new URL(REDIS_URL);
    a = await start('fastify', {
      store: { redis: { host: hostname, port: Number(port || 6379), db: 3, keyPrefix: clientPrefix } },
      keyPrefix,
      localCache: true,
    });
  });
  afterAll(async () => {
    await a?.app.close();
    redis?.disconnect();
  });

  it('hears a DEL of the prefixed key in db 3', async () => {
    const k = randomUUID();
    const { storageKey, run } = await cached(a, 'long', k);
    expect(await redis.exists(`${clientPrefix}${storageKey}`)).toBe(1);
    await redis.del(`${clientPrefix}${storageKey}`);
    await heard(a, storageKey);
    expect(await post(a, 'long', k)).toMatchObject({ status: 201, replayed: false, run: run + 1 });
  });
});

describe('localCache on a redis-server of its own: flushes and restarts', () => {
  const keyPrefix = `rvfl${randomUUID().slice(0, 8)}`;
  let server: RedisServer;
  let port: number;
  let a: Instance | undefined;
  let redis: Redis;

  beforeAll(async () => {
    port = await freePort();
    server = await startRedisServer(port);
    redis = new Redis(server.url, { maxRetriesPerRequest: 1 });
    redis.on('error', () => undefined);
  });
  afterEach(async () => {
    await a?.app.close();
    a = undefined;
  });
  afterAll(async () => {
    redis?.disconnect();
    await server?.kill();
  });

  it.each(['FLUSHDB', 'FLUSHALL', 'FLUSHDB ASYNC'])('%s: the next duplicate runs the handler', async (command) => {
    a = await start('express', { store: { redis: server.url }, keyPrefix, localCache: true });
    const k = randomUUID();
    const { storageKey, run } = await cached(a, 'long', k);
    const [name, ...args] = command.split(' ');
    await redis.call(name, ...args);
    await heard(a, storageKey);
    expect(await post(a, 'long', k)).toMatchObject({ status: 201, replayed: false, run: run + 1 });
  });

  // Redis announces no invalidation for SWAPDB (README: "SWAPDB is not announced"); what the
  // README tells operators to run after one: a FLUSHDB of an empty spare db, announced to all.
  it('SWAPDB 0 1, then FLUSHDB of an empty spare db (the README\'s remedy): the next duplicate runs the handler', async () => {
    a = await start('express', { store: { redis: server.url }, keyPrefix, localCache: true });
    const k = randomUUID();
    const { storageKey, run } = await cached(a, 'long', k);
    const spare = new Redis(`${server.url}/15`);
    try {
      await redis.swapdb(0, 1);
      expect(await redis.exists(storageKey)).toBe(0);
      expect(await spare.dbsize()).toBe(0);
      await spare.flushdb();
      await heard(a, storageKey);
      expect(await post(a, 'long', k)).toMatchObject({ status: 201, replayed: false, run: run + 1 });
    } finally {
      spare.disconnect();
      await redis.swapdb(0, 1);
    }
  });

  it('eviction under maxmemory (allkeys-lru): once Redis evicted the record, the next duplicate runs the handler', async () => {
    a = await start('express', { store: { redis: server.url }, keyPrefix, localCache: true });
    const k = randomUUID();
    const { storageKey, run } = await cached(a, 'long', k);
    await redis.config('SET', 'maxmemory-policy', 'allkeys-lru');
    const used = Number(/used_memory:(\d+)/.exec(await redis.info('memory'))![1]);
    await redis.config('SET', 'maxmemory', String(used + 2 * 1024 * 1024));
    try {
      const filler = 'f'.repeat(10_000);
      for (let i = 0; i < 2000 && (await redis.exists(storageKey)) === 1; i += 100) {
        const batch = redis.pipeline();
        for (let j = i; j < i + 100; j++) batch.set(`${keyPrefix}:fill:${j}`, filler);
        await batch.exec();
      }
      expect(await redis.exists(storageKey)).toBe(0);
    } finally {
      await redis.config('SET', 'maxmemory', '0');
    }
    await heard(a, storageKey);
    expect(await post(a!, 'long', k)).toMatchObject({ status: 201, replayed: false, run: run + 1 });
  });

  it('a Redis restart (the data is gone): the next duplicates run the handler once', async () => {
    a = await start('fastify', { store: { redis: server.url }, keyPrefix, localCache: true });
    const k = randomUUID();
    const { run } = await cached(a, 'long', k);
    await server.kill();
    server = await startRedisServer(port);
    await storeBack(a!);
    const answers = await Promise.all(Array.from({ length: 10 }, () => post(a!, 'long', k)));
    expect(answers.filter((x) => x.run === run)).toEqual([]);
    expect(runs.get(k)).toBe(run + 1);
  });
});

/** A TCP forwarder whose upstream can be switched: a failover behind one address. */
class SwitchingProxy {
  private server!: Server;
  private readonly sockets = new Set<Socket>();
  port = 0;
  constructor(public target: number) {}
  async start(): Promise<this> {
    this.server = createServer((client) => {
      const upstream = createConnection({ host: '127.0.0.1', port: this.target });
      for (const socket of [client, upstream]) {
        this.sockets.add(socket);
        socket.on('close', () => this.sockets.delete(socket));
        socket.on('error', () => socket.destroy());
      }
      client.pipe(upstream);
      upstream.pipe(client);
      client.on('close', () => upstream.destroy());
      upstream.on('close', () => client.destroy());
    });
    await new Promise<void>((resolve) => this.server.listen(0, '127.0.0.1', resolve));
    this.port = (this.server.address() as { port: number }).port;
    return this;
  }
  failover(target: number): void {
    this.target = target;
    for (const socket of this.sockets) socket.destroy();
  }
  async stop(): Promise<void> {
    for (const socket of this.sockets) socket.destroy();
    await new Promise((resolve) => this.server.close(resolve));
  }
}

describe('localCache across a failover-like reconnect (one address, another server behind it)', () => {
  const keyPrefix = `rvfo${randomUUID().slice(0, 8)}`;
  let first: RedisServer;
  let second: RedisServer;
  let proxy: SwitchingProxy;
  let a: Instance;

  beforeAll(async () => {
    [first, second] = await Promise.all([startRedisServer(), startRedisServer()]);
    proxy = await new SwitchingProxy(first.port).start();
    a = await start('express', { store: { redis: `redis://127.0.0.1:${proxy.port}` }, keyPrefix, localCache: true });
  });
  afterAll(async () => {
    await a?.app.close();
    await proxy?.stop();
    await Promise.all([first?.kill(), second?.kill()]);
  });

  it('after the switch, duplicates get what the new server holds, never the old server\'s record', async () => {
    const k = randomUUID();
    const { storageKey, run } = await cached(a, 'long', k);
    const old = new Redis(first.url);
    const next = new Redis(second.url);
    try {
      // The new primary holds an older state of the key: a claim in progress (another instance runs it).
      const value = (await old.get(storageKey))!;
      const head = JSON.parse(value.slice(1, value.indexOf('\n'))) as [string, string];
      await next.set(storageKey, `P${JSON.stringify([randomUUID(), head[1], Date.now() + 60_000])}`, 'PX', 60_000);
      proxy.failover(second.port);
      await storeBack(a);
      expect(await post(a, 'long', k)).toMatchObject({ status: 409, code: 'IDEMPOTENCY_IN_PROGRESS' });
      expect(runs.get(k)).toBe(run);
    } finally {
      old.disconnect();
      next.disconnect();
    }
  });
});

describe('forget + re-run + replays across two instances (Express, Fastify) under load', () => {
  const keyPrefix = `rvrc${randomUUID().slice(0, 8)}`;
  let a: Instance;
  let b: Instance;

  beforeAll(async () => {
    const options: IdempotencyModuleOptions = { store: { redis: REDIS_URL }, keyPrefix, localCache: true };
    [a, b] = await Promise.all([start('express', options), start('fastify', options)]);
  });
  afterAll(async () => {
    await Promise.all([a?.app.close(), b?.app.close()]);
  });

  it('no request sent after a forget returned gets an answer older than that forget (10 rounds, 3 forgets each)', async () => {
    const stale: string[] = [];
    for (let round = 0; round < 10; round++) {
      const k = randomUUID();
      await cached(a, 'long', k);
      await post(b, 'long', k);
      const storageKey = a.admin.storageKeyOf({ user: { anonymous: true }, handler: handlerOf('long'), key: k });
      await eventually(() => holds(b.cache, storageKey), { timeoutMs: 3000 });
      // Replays hammer both instances while the forgets run; a forget's floor is the run after it.
      let floor = 1;
      let stop = false;
      const hammer = async (instance: Instance) => {
        while (!stop) {
          const sentFloor = floor;
          const answer = await post(instance, 'long', k);
          if (answer.status === 201 && answer.run! < sentFloor) stale.push(`round ${round}: run ${answer.run} after floor ${sentFloor}`);
          if (answer.status >= 500) stale.push(`round ${round}: ${answer.status}`);
        }
      };
      const hammers = [a, b, a, b, a, b].map(hammer);
      for (let i = 0; i < 3; i++) {
        await settle(30);
        const forgetter = i % 2 === 0 ? b : a;
        const current = runs.get(k)!;
        const result = await forgetter.admin.forget({ user: { anonymous: true }, handler: handlerOf('long'), key: k });
        if (result.forgotten) floor = current + 1;
        await eventually(() => runs.get(k)! > current || !result.forgotten, { timeoutMs: 3000 });
      }
      await settle(30);
      stop = true;
      await Promise.all(hammers);
    }
    expect(stale).toEqual([]);
  });
});

describe('a forget returns once every instance with a cache heard it', () => {
  const keyPrefix = `heard${randomUUID().slice(0, 8)}`;
  let proxy: TcpProxy;
  let a: Instance;
  let b: Instance;

  beforeAll(async () => {
    // B reaches Redis through a proxy that can slow its link (a loaded instance, a far zone).
    proxy = await new TcpProxy({ host: new URL(REDIS_URL).hostname, port: Number(new URL(REDIS_URL).port || 6379) }).start();
    [a, b] = await Promise.all([
      start('express', { store: { redis: REDIS_URL }, keyPrefix, localCache: true }),
      start('fastify', { store: { redis: proxy.url }, keyPrefix, localCache: true }),
    ]);
  });
  afterEach(() => {
    proxy.delayMs = 0;
  });
  afterAll(async () => {
    proxy.delayMs = 0;
    await Promise.all([a?.app.close(), b?.app.close()]);
    await proxy?.stop();
  });

  it('an instance that hears it 300 ms late: the forget waits for it, and a retry sent there the moment it returns runs the handler', async () => {
    const k = randomUUID();
    const { storageKey, run } = await cached(b, 'long', k);
    proxy.delayMs = 300;
    const startedAt = performance.now();
    expect(await a.admin.forget({ user: { anonymous: true }, handler: handlerOf('long'), key: k })).toMatchObject({ forgotten: true });
    // On the code before, the forget returned in a few ms, and B replayed the forgotten answer.
    expect(holds(b.cache, storageKey)).toBe(false);
    expect(performance.now() - startedAt).toBeGreaterThanOrEqual(300);
    expect(await post(b, 'long', k)).toMatchObject({ status: 201, replayed: false, run: run + 1 });
  });

  it('an instance that does not answer in time: the forget returns after its bound (2 s), forgotten', async () => {
    const k = randomUUID();
    await cached(b, 'long', k);
    proxy.delayMs = 5000;
    const startedAt = performance.now();
    expect(await a.admin.forget({ user: { anonymous: true }, handler: handlerOf('long'), key: k })).toMatchObject({ forgotten: true });
    const tookMs = performance.now() - startedAt;
    expect(tookMs).toBeGreaterThanOrEqual(1900);
    expect(tookMs).toBeLessThan(4000);
  });
});
