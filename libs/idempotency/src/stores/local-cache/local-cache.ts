import { Logger } from '@nestjs/common';
import type { Redis } from 'ioredis';
import { IdempotencyConfigError } from '../../errors/idempotency.errors.js';
import type { IdempotencyStore } from '../idempotency-store.js';
import { MemoryIdempotencyStore } from '../memory/memory-idempotency.store.js';
import { RedisIdempotencyStore } from '../redis/redis-idempotency.store.js';
import { LocalCacheIdempotencyStore } from './local-cache.store.js';
import type { LocalCacheBounds } from './local-cache-options.js';
import { RedisRecordTracking } from './redis-record-tracking.js';

/**
 * `store` with the local cache of completed records in front, where its records can be tracked
 * across instances: the Redis store on a single primary. The memory store needs none (its records
 * are in this process already) and is returned as it is. Any other store is refused at start-up,
 * since nothing would tell this process that another one forgot or replaced a record.
 */
export function withLocalCache(store: IdempotencyStore, bounds: LocalCacheBounds): IdempotencyStore {
  if (store instanceof LocalCacheIdempotencyStore) return store;
  if (store instanceof MemoryIdempotencyStore) {
    new Logger('IdempotencyModule').log('localCache: the memory store answers replays in this process already; no cache is added');
    return store;
  }
  if (store instanceof RedisIdempotencyStore) {
    if (store.client.isCluster) {
      throw new IdempotencyConfigError(
        'IdempotencyModule: localCache is not available on a Redis Cluster client: Redis tracks the keys a connection reads on each node separately, so a record forgotten on another instance could stay cached here. Remove localCache, or use a single primary',
      );
    }
    return new LocalCacheIdempotencyStore(store, new RedisRecordTracking(store.client as Redis), bounds);
  }
  throw new IdempotencyConfigError(
    `IdempotencyModule: localCache needs the Redis store; ${store.constructor.name} cannot tell this process that another instance forgot or replaced a record, so a cached answer could outlive it. Remove localCache`,
  );
}
