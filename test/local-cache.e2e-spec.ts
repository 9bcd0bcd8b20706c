import { afterAll, beforeAll, describe, expect, it } from '@jest/globals';
import { Body, Controller, Post, type INestApplication } from '@nestjs/common';
import type { Redis } from 'ioredis';
import { randomUUID } from 'node:crypto';
import {
  IdempotencyAdmin,
  IdempotencyStore,
  LocalCacheIdempotencyStore,
  NoRepeatSubmit,
  type IdempotencyModuleOptions,
} from 'nestjs-idempotency';
import { PostgresIdempotencyStore } from 'nestjs-idempotency/typeorm';
import { DataSource } from 'typeorm';
import { eventually } from './support/eventually.js';
import { connectRedis, DATABASE_URL, REDIS_URL } from './support/services.js';
import { makeApp } from './support/edge-app.js';

/** Handler runs, counted across every app of this file: instances of one service. */
const runs = { count: 0 };

@Controller('orders')
class LocalCacheController {
  @Post()
  @NoRepeatSubmit({ expireSeconds: 60 })
  create(@Body() body: { orderNo: string }) {
    return { orderNo: body.orderNo, run: ++runs.count };
  }
}

interface Instance {
  app: INestApplication;
  url: string;
  admin: IdempotencyAdmin;
  cache: LocalCacheIdempotencyStore;
}

async function start(adapter: 'express' | 'fastify', options: IdempotencyModuleOptions): Promise<Instance> {
  const { app, url } = await makeApp(adapter, [LocalCacheController], options);
  return { app, url, admin: app.get(IdempotencyAdmin), cache: app.get(IdempotencyStore) as LocalCacheIdempotencyStore };
}

async function order(instance: Instance, key: string) {
  const res = await fetch(`${instance.url}/orders`, {
    method: 'POST',
    headers: { 'content-type': 'application/json', 'idempotency-key': key },
    body: JSON.stringify({ orderNo: key }),
  });
  const body = (await res.json()) as { run?: number; code?: string };
  return { status: res.status, replayed: res.headers.get('idempotent-replayed') === 'true', run: body.run, code: body.code };
}

const at = (instance: Instance, key: string, n: number) => Array.from({ length: n }, () => order(instance, key));

/** The commands naming `storageKey` that clients sent while `run` ran (MONITOR; not those scripts ran). */
async function commandsOn(redis: Redis, storageKey: string, run: () => Promise<unknown>): Promise<string[]> {
  const sent: string[] = [];
  const monitor = await redis.monitor();
  monitor.on('monitor', (_time: string, args: string[], source: string) => {
    if (source !== 'lua' && args.includes(storageKey)) sent.push(args[0].toLowerCase());
  });
  await run();
  await new Promise((resolve) => setTimeout(resolve, 50));
  monitor.disconnect();
  return sent;
}

describe('localCache: two instances (Express, Fastify) on one Redis', () => {
  const keyPrefix = `lc${randomUUID().slice(0, 8)}`;
  const cached: IdempotencyModuleOptions = { store: { redis: REDIS_URL }, keyPrefix, localCache: true };
  let a: Instance;
  let b: Instance;
  let redis: Redis;
  const storageKeyOf = (key: string) => a.admin.storageKeyOf({ user: { anonymous: true }, handler: 'LocalCacheController.create', key });

  beforeAll(async () => {
    redis = await connectRedis();
    [a, b] = await Promise.all([start('express', cached), start('fastify', cached)]);
  });
  afterAll(async () => {
    await Promise.all([a?.app.close(), b?.app.close()]);
    redis?.disconnect();
  });

  it('replays a record each instance has seen to 100 parallel duplicates with no Redis command, and runs the handler once', async () => {
    const key = `seen-${randomUUID()}`;
    const before = runs.count;
    expect(await order(a, key)).toMatchObject({ status: 201, replayed: false });
    // Its first replay is Redis's (one claim): the instance keeps what it replayed, not what it saved.
    expect(await order(a, key)).toMatchObject({ status: 201, replayed: true, run: before + 1 });
    await eventually(() => a.cache.cacheStats().entries > 0, { timeoutMs: 2000 });
    const sentByA = await commandsOn(redis, storageKeyOf(key), async () => {
      const answers = await Promise.all(at(a, key, 100));
      expect(answers.every((x) => x.status === 201 && x.replayed && x.run === before + 1)).toBe(true);
    });
    expect(sentByA).toEqual([]);
    // The other instance learns the record from its first replay (one claim), then answers alone.
    expect(await order(b, key)).toMatchObject({ status: 201, replayed: true, run: before + 1 });
    await eventually(() => b.cache.cacheStats().entries > 0, { timeoutMs: 2000 });
    const sentByB = await commandsOn(redis, storageKeyOf(key), () => Promise.all(at(b, key, 100)));
    expect(sentByB).toEqual([]);
    expect(runs.count).toBe(before + 1);
  });

  it('hears an admin forget on the other instance: the next duplicates, 40 at once on both, run the handler once more and never get the old answer', async () => {
    const key = `forget-${randomUUID()}`;
    const first = await order(a, key);
    await order(b, key);
    await order(a, key);
    await eventually(() => a.cache.cacheStats().entries > 0 && b.cache.cacheStats().entries > 0, { timeoutMs: 2000 });
    expect(await b.admin.forget({ user: { anonymous: true }, handler: 'LocalCacheController.create', key })).toMatchObject({ forgotten: true });
    const answers = await Promise.all([...at(a, key, 20), ...at(b, key, 20)]);
    expect(answers.filter((x) => x.run === first.run)).toEqual([]);
    expect(answers.filter((x) => x.status === 201 && !x.replayed)).toHaveLength(1);
    for (const x of answers) {
      expect({ ...x, expected: (x.status === 201 && x.run === first.run! + 1) || x.code === 'IDEMPOTENCY_IN_PROGRESS' }).toMatchObject({ expected: true });
    }
    expect(runs.count).toBe(first.run! + 1);
  });

  it('without the cache, sends one Redis command per replay', async () => {
    const plain = await start('express', { ...cached, localCache: false });
    try {
      expect(plain.app.get(IdempotencyStore)).not.toBeInstanceOf(LocalCacheIdempotencyStore);
      const key = `plain-${randomUUID()}`;
      await order(plain, key);
      const sent = await commandsOn(redis, storageKeyOf(key), async () => {
        for (let i = 0; i < 20; i++) expect(await order(plain, key)).toMatchObject({ status: 201, replayed: true });
      });
      expect(sent).toEqual(Array(20).fill('set'));
    } finally {
      await plain.app.close();
    }
  });

  it('refuses the PostgreSQL store at start-up: nothing would tell it another instance forgot a record', async () => {
    const store = new PostgresIdempotencyStore(new DataSource({ type: 'postgres', url: DATABASE_URL }));
    await expect(makeApp('express', [LocalCacheController], { store, localCache: true })).rejects.toThrow(
      /localCache needs the Redis store; PostgresIdempotencyStore/,
    );
  });
});
