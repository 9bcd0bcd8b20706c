// The store contract suite (`nestjs-idempotency/testing`) run on the local cache
// itself, in front of the real Redis, with tracking on: what the guard's store is under
// `localCache`, as the built-in stores run it.
import { describe } from '@jest/globals';
import { Redis } from 'ioredis';
import { LocalCacheIdempotencyStore, RedisIdempotencyStore } from 'nestjs-idempotency';
import { describeStoreContract } from 'nestjs-idempotency/testing';
import { RedisRecordTracking } from '../libs/idempotency/src/stores/local-cache/redis-record-tracking.js';
import { REDIS_URL } from './support/services.js';

const sleep = (ms: number) => new Promise<void>((resolve) => setTimeout(resolve, ms));

describe('LocalCacheIdempotencyStore over Redis', () => {
  describeStoreContract(
    'local cache over redis',
    async () => {
      const client = new Redis(REDIS_URL, { maxRetriesPerRequest: 0 });
      const redis = new RedisIdempotencyStore(client);
      const store = new LocalCacheIdempotencyStore(redis, new RedisRecordTracking(client), { maxEntries: 1000, maxBytes: 1 << 20 });
      await store.onModuleInit();
      return {
        store,
        // Real time (Redis expiry), and time for the cache's read-backs to land.
        elapse: sleep,
        close: async () => {
          await store.onApplicationShutdown();
          await client.quit();
        },
      };
    },
    300,
  );
});
