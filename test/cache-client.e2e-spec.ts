// The local cache's connections. A client the user hands in (`{ redis: client }`),
// one the module opens, ioredis 5, and what app.close() leaves behind.
import { afterAll, beforeAll, describe, expect, it } from '@jest/globals';
import { Body, Controller, Post, type INestApplication } from '@nestjs/common';
import { Redis } from 'ioredis';
import { execFile } from 'node:child_process';
import { randomUUID } from 'node:crypto';
import { mkdtemp, rm, writeFile } from 'node:fs/promises';
import { createRequire } from 'node:module';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { promisify } from 'node:util';
import {
  IdempotencyAdmin,
  IdempotencyStore,
  LocalCacheIdempotencyStore,
  NoRepeatSubmit,
  type IdempotencyModuleOptions,
} from 'nestjs-idempotency';
import { eventually } from './support/eventually.js';
import { startRedisServer, type RedisServer } from './support/redis-server.js';
import { connectRedis, REDIS_URL } from './support/services.js';
import { makeApp } from './support/edge-app.js';

const runs = new Map<string, number>();

@Controller('probe')
class ProbeController {
  @Post()
  @NoRepeatSubmit({ expireSeconds: 600 })
  create(@Body() body: { k: string }) {
    const run = (runs.get(body.k) ?? 0) + 1;
    runs.set(body.k, run);
    return { k: body.k, run };
  }
}

interface Instance {
  app: INestApplication;
  url: string;
  admin: IdempotencyAdmin;
  store: IdempotencyStore;
}

async function start(adapter: 'express' | 'fastify', options: IdempotencyModuleOptions): Promise<Instance> {
  const { app, url } = await makeApp(adapter, [ProbeController], options);
  return { app, url, admin: app.get(IdempotencyAdmin), store: app.get(IdempotencyStore) };
}

async function post(instance: Instance, k: string) {
  const res = await fetch(`${instance.url}/probe`, {
    method: 'POST',
    headers: { 'content-type': 'application/json', 'idempotency-key': k },
    body: JSON.stringify({ k }),
  });
  const body = (await res.json()) as { run?: number; code?: string };
  return { status: res.status, replayed: res.headers.get('idempotent-replayed') === 'true', run: body.run, code: body.code };
}

const cacheOf = (instance: Instance) => instance.store as LocalCacheIdempotencyStore;
const holds = (instance: Instance, storageKey: string) =>
  (cacheOf(instance) as unknown as { records: { entries: Map<string, unknown> } }).records.entries.has(storageKey);
const storageKeyOf = (instance: Instance, k: string) =>
  instance.admin.storageKeyOf({ user: { anonymous: true }, handler: 'ProbeController.create', key: k });

/** Connections Redis has under this client name. */
async function connectionsNamed(redis: Redis, name: string): Promise<number> {
  const list = (await redis.client('LIST')) as string;
  return list.split('\n').filter((line) => line.includes(` name=${name} `)).length;
}

const settle = (ms = 100) => new Promise((resolve) => setTimeout(resolve, ms));

describe('localCache on a client the user hands in ({ redis: client })', () => {
  let observer: Redis;
  beforeAll(async () => {
    observer = await connectRedis();
  });
  afterAll(() => observer?.disconnect());

  it('opens two connections of its own (the tracked reader, the subscriber), closes them on app.close(), leaves the user\'s client open with tracking off', async () => {
    const name = `rvuc${randomUUID().slice(0, 8)}`;
    const client = new Redis(REDIS_URL, { connectionName: name });
    await client.ping();
    try {
      expect(await connectionsNamed(observer, name)).toBe(1);
      const a = await start('express', { store: { redis: client }, keyPrefix: name, localCache: true });
      await eventually(() => cacheOf(a).cacheStats().live, { timeoutMs: 3000 });
      const k = randomUUID();
      await post(a, k);
      await post(a, k);
      const during = await connectionsNamed(observer, name);
      await a.app.close();
      await eventually(async () => (await connectionsNamed(observer, name)) === 1, { timeoutMs: 3000 }).catch(() => undefined);
      expect({ during, after: await connectionsNamed(observer, name) }).toEqual({ during: 3, after: 1 });
      expect(client.status).toBe('ready');
      const info = (await client.client('TRACKINGINFO')) as unknown as unknown[];
      expect(info[info.indexOf('flags') + 1]).toEqual(['off']);
    } finally {
      client.disconnect();
    }
  });

  it('a module-owned client: app.close() leaves no connection behind', async () => {
    const name = `rvmo${randomUUID().slice(0, 8)}`;
    const { hostname, port } = new URL(REDIS_URL);
    const a = await start('fastify', { store: { redis: { host: hostname, port: Number(port || 6379), connectionName: name } }, keyPrefix: name, localCache: true });
    await eventually(() => cacheOf(a).cacheStats().live, { timeoutMs: 3000 });
    const k = randomUUID();
    await post(a, k);
    await post(a, k);
    expect(await connectionsNamed(observer, name)).toBe(3);
    await a.app.close();
    await eventually(async () => (await connectionsNamed(observer, name)) === 0, { timeoutMs: 2000 });
  });

  it('app.close() leaves no socket of the cache, nor a timer keeping the process alive', async () => {
    const count = () => {
      const all = process.getActiveResourcesInfo();
      return { timeouts: all.filter((x) => x === 'Timeout').length, sockets: all.filter((x) => x === 'TCPSocketWrap').length };
    };
    // One app opened and closed first, so that lazily loaded modules keep nothing of theirs in the count.
    const warm = await start('express', { store: { redis: REDIS_URL }, keyPrefix: `rvw${randomUUID().slice(0, 8)}`, localCache: true });
    await warm.app.close();
    await settle(200);
    const before = count();
    const a = await start('express', { store: { redis: REDIS_URL }, keyPrefix: `rvh${randomUUID().slice(0, 8)}`, localCache: true });
    await eventually(() => cacheOf(a).cacheStats().live, { timeoutMs: 3000 });
    await post(a, randomUUID());
    await settle(1200); // at least one heartbeat
    await a.app.close();
    // The count is the whole process's: a timer of something else still running (a reconnect of an
    // earlier test's client) may be live at one instant. A cache's heartbeat never ends, so waiting
    // for the count to come down still fails on a leaked one.
    const within = () => {
      const after = count();
      return after.timeouts <= before.timeouts && after.sockets <= before.sockets;
    };
    await eventually(within, { timeoutMs: 5000, describe: () => JSON.stringify({ before, after: count() }) });
  });

  // Tracking is a connection's state: were it turned on on the shared client, each cache's CLIENT
  // TRACKING ON REDIRECT would steal the other's redirect (both still live, the robbed one deaf
  // until its heartbeat notices, and a forgotten answer replayed meanwhile). Each cache tracks on
  // a connection of its own.
  it('two modules on one shared client, both with localCache: a forget elsewhere is heard by both, never a stale replay', async () => {
    const keyPrefix = `rvsh${randomUUID().slice(0, 8)}`;
    const shared = new Redis(REDIS_URL);
    const options: IdempotencyModuleOptions = { store: { redis: shared }, keyPrefix, localCache: true };
    const first = await start('express', options);
    const second = await start('fastify', options);
    const operator = await start('express', { store: { redis: REDIS_URL }, keyPrefix });
    try {
      const stale: string[] = [];
      let checked = 0;
      for (let i = 0; i < 12; i++) {
        const k = randomUUID();
        const firstRun = (await post(first, k)).run!;
        // A replay on each: each cache keeps what its instance replayed.
        await post(second, k);
        await post(first, k);
        // Whichever cache holds the record (the two reset each other's tracking: see below).
        const holding = () => [first, second].filter((x) => holds(x, storageKeyOf(x, k)));
        try {
          await eventually(() => holding().length > 0, { timeoutMs: 1500 });
        } catch {
          continue;
        }
        const held = holding();
        expect(await operator.admin.forget(storageKeyOf(operator, k))).toMatchObject({ forgotten: true });
        // Pushed, it is heard in milliseconds; a deaf cache would hold it until its heartbeat (1 s).
        await eventually(() => held.every((x) => !holds(x, storageKeyOf(x, k))), { timeoutMs: 500 }).catch(() => undefined);
        for (const instance of held) {
          checked++;
          const answer = await post(instance, k);
          if (answer.run === firstRun) stale.push(`${instance === first ? 'first' : 'second'}: the forgotten answer (run ${firstRun}) 500 ms after the forget`);
        }
      }
      expect(checked).toBeGreaterThan(0);
      expect(stale).toEqual([]);
    } finally {
      await Promise.all([first.app.close(), second.app.close(), operator.app.close()]);
      shared.disconnect();
    }
  });
});

describe('localCache: app.close() while Redis is down', () => {
  it.each(['module-owned', 'user-supplied'] as const)('returns within 3 s, with a %s client', async (kind) => {
    const server = await startRedisServer();
    const resourcesBefore = process.getActiveResourcesInfo();
    const client = kind === 'user-supplied' ? new Redis(server.url) : undefined;
    client?.on('error', () => undefined);
    const a = await start('express', { store: { redis: client ?? server.url }, keyPrefix: 'rvdown', localCache: true });
    try {
      await eventually(() => cacheOf(a).cacheStats().live, { timeoutMs: 3000 });
      const k = randomUUID();
      await post(a, k);
      await post(a, k);
      await server.kill();
      await settle(1500); // a heartbeat or two while it is down
      const startedAt = Date.now();
      const closed = await Promise.race([a.app.close().then(() => 'closed'), settle(3000).then(() => 'still closing')]);
      expect({ closed, ms: Date.now() - startedAt < 3000 }).toEqual({ closed: 'closed', ms: true });
      client?.disconnect();
      await settle(2500);
      const left = process.getActiveResourcesInfo();
      const count = (list: string[], type: string) => list.filter((x) => x === type).length;
      // Nothing of the app keeps reconnecting to the dead Redis: no more timers or sockets than before it.
      expect({ timeouts: count(left, 'Timeout') <= count(resourcesBefore, 'Timeout'), sockets: count(left, 'TCPSocketWrap') <= count(resourcesBefore, 'TCPSocketWrap') }).toEqual({ timeouts: true, sockets: true });
    } finally {
      client?.disconnect();
      await server.kill();
    }
  });
});

describe('localCache with ioredis 5 (the lowest the package accepts: 5.3.0), on a redis-server of its own', () => {
  let dir: string;
  let server: RedisServer;
  let Redis5: typeof Redis;
  beforeAll(async () => {
    dir = await mkdtemp(join(tmpdir(), 'rv-ioredis5-'));
    await writeFile(join(dir, 'package.json'), JSON.stringify({ name: 'rv-ioredis5', private: true }));
    await promisify(execFile)('npm', ['install', 'ioredis@5.3.0', '--prefer-offline', '--no-audit', '--no-fund'], { cwd: dir });
    Redis5 = (createRequire(join(dir, 'package.json'))('ioredis') as { default: typeof Redis }).default;
    server = await startRedisServer();
  }, 120_000);
  afterAll(async () => {
    await server?.kill();
    if (dir) await rm(dir, { recursive: true, force: true });
  });

  it('replays from the cache, hears a DEL and a FLUSHDB, and closes its own connections', async () => {
    const client = new Redis5(server.url, { connectionName: 'rv5' });
    expect((client as unknown as { options: { protocol?: number } }).options.protocol).toBeUndefined();
    const observer = new Redis(server.url);
    const a = await start('express', { store: { redis: client }, keyPrefix: 'rv5', localCache: true });
    try {
      await eventually(() => cacheOf(a).cacheStats().live, { timeoutMs: 3000 });
      const k = randomUUID();
      const run = (await post(a, k)).run!;
      expect(await post(a, k)).toMatchObject({ status: 201, replayed: true, run }); // from Redis: the cache reads it back
      await eventually(() => holds(a, storageKeyOf(a, k)), { timeoutMs: 3000 });
      expect(await post(a, k)).toMatchObject({ status: 201, replayed: true, run });
      await observer.del(storageKeyOf(a, k));
      await eventually(() => !holds(a, storageKeyOf(a, k)), { timeoutMs: 2000 });
      expect(await post(a, k)).toMatchObject({ status: 201, replayed: false, run: run + 1 });
      expect(await post(a, k)).toMatchObject({ status: 201, replayed: true, run: run + 1 });
      await eventually(() => holds(a, storageKeyOf(a, k)), { timeoutMs: 3000 });
      await observer.flushdb();
      await eventually(() => !holds(a, storageKeyOf(a, k)), { timeoutMs: 2000 });
      expect(await post(a, k)).toMatchObject({ status: 201, replayed: false, run: run + 2 });
      await a.app.close();
      await eventually(async () => (await connectionsNamed(observer, 'rv5')) === 1, { timeoutMs: 3000 }).catch(() => undefined);
      expect(await connectionsNamed(observer, 'rv5')).toBe(1);
    } finally {
      client.disconnect();
      observer.disconnect();
    }
  });
});
