import { afterEach, describe, expect, it, jest } from '@jest/globals';
import { Logger } from '@nestjs/common';
import { Test } from '@nestjs/testing';
import { Cluster, Redis } from 'ioredis';
import { randomUUID } from 'node:crypto';
import { eventually } from '../../../../../test/support/eventually.js';
import { REDIS_URL } from '../../../../../test/support/services.js';
import { IdempotencyModule } from '../../idempotency.module.js';
import type { IdempotencyModuleOptions } from '../../idempotency.options.js';
import { IdempotencyStore, type ClaimResult } from '../idempotency-store.js';
import { MemoryIdempotencyStore } from '../memory/memory-idempotency.store.js';
import { RedisIdempotencyStore } from '../redis/redis-idempotency.store.js';
import { LocalCacheIdempotencyStore } from './local-cache.store.js';

/** A store of the user's own (never called here): it has no way to hear of another instance's changes. */
class OwnStore extends IdempotencyStore {
  claim(): Promise<ClaimResult> {
    throw new Error('unused');
  }
  complete(): Promise<boolean> {
    throw new Error('unused');
  }
  release(): Promise<boolean> {
    throw new Error('unused');
  }
  renew(): Promise<boolean> {
    throw new Error('unused');
  }
  get(): Promise<undefined> {
    throw new Error('unused');
  }
}

const boot = (options: IdempotencyModuleOptions) => Test.createTestingModule({ imports: [IdempotencyModule.forRoot(options)] }).compile();

describe('IdempotencyModule.forRoot({ localCache })', () => {
  afterEach(() => {
    jest.restoreAllMocks();
  });

  it('puts the cache in front of the Redis store it opens, tracks from start-up on its own connection, and closes all three', async () => {
    const name = `lcmod${randomUUID().slice(0, 8)}`;
    const { hostname, port } = new URL(REDIS_URL);
    const moduleRef = await boot({ store: { redis: { host: hostname, port: Number(port || 6379), connectionName: name } }, localCache: true });
    await moduleRef.init();
    const store = moduleRef.get(IdempotencyStore);
    expect(store).toBeInstanceOf(LocalCacheIdempotencyStore);
    const redis = (store as LocalCacheIdempotencyStore).store as RedisIdempotencyStore;
    expect(redis).toBeInstanceOf(RedisIdempotencyStore);
    expect((store as LocalCacheIdempotencyStore).cacheStats()).toEqual({ entries: 0, bytes: 0, live: true });
    // The store's client does not track; the cache's reader does, redirected to its subscriber.
    expect(await redis.client.client('TRACKINGINFO')).toContainEqual(['off']);
    const named = ((await (redis.client as Redis).client('LIST')) as string).split('\n').filter((line) => line.includes(` name=${name} `));
    expect(named.filter((line) => / flags=t /.test(line))).toHaveLength(1);
    expect(named).toHaveLength(3);
    const observer = new Redis(REDIS_URL, { maxRetriesPerRequest: 0 });
    try {
      await moduleRef.close();
      await eventually(async () => !((await observer.client('LIST')) as string).includes(` name=${name} `), { timeoutMs: 2000 });
    } finally {
      observer.disconnect();
    }
  });

  it('caches on a Redis client it is given, and leaves it open with tracking off on shutdown', async () => {
    const client = new Redis(REDIS_URL, { maxRetriesPerRequest: 0 });
    const moduleRef = await boot({ store: { redis: client }, localCache: { maxEntries: 5 } });
    await moduleRef.init();
    expect(moduleRef.get(IdempotencyStore)).toBeInstanceOf(LocalCacheIdempotencyStore);
    await moduleRef.close();
    expect(await client.client('TRACKINGINFO')).toContainEqual(['off']);
    await client.quit();
  });

  it('adds nothing to the memory store, which answers in this process already, and says so', async () => {
    const log = jest.spyOn(Logger.prototype, 'log').mockImplementation(() => undefined);
    const moduleRef = await boot({ store: new MemoryIdempotencyStore(), localCache: true });
    expect(moduleRef.get(IdempotencyStore)).toBeInstanceOf(MemoryIdempotencyStore);
    expect(log.mock.calls.map(([message]) => String(message))).toContainEqual(expect.stringMatching(/memory store .* no cache/));
    await moduleRef.close();
  });

  it('refuses a Redis Cluster client at start-up', async () => {
    const cluster = new Cluster([{ host: '127.0.0.1', port: 1 }], { lazyConnect: true });
    await expect(boot({ store: { redis: cluster }, localCache: true })).rejects.toThrow(/localCache is not available on a Redis Cluster client/);
    cluster.disconnect();
  });

  it('refuses a store that cannot tell it another instance forgot a record', async () => {
    await expect(boot({ store: new OwnStore(), localCache: true })).rejects.toThrow(/localCache needs the Redis store; OwnStore cannot tell/);
  });

  it.each([{ maxEntries: 0 }, { maxEntries: -1 }, { maxBytes: 1.5 }, { maxBytes: Number.NaN }, 'yes'])(
    'refuses localCache %p at start-up',
    async (localCache) => {
      await expect(boot({ store: new MemoryIdempotencyStore(), localCache: localCache as IdempotencyModuleOptions['localCache'] })).rejects.toThrow(
        /localCache/,
      );
    },
  );
});
