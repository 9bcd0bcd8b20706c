import { Logger } from '@nestjs/common';
import { Cluster, Redis, type RedisOptions } from 'ioredis';
import { DEFAULTS } from '../idempotency.constants.js';
import type { IdempotencyModuleOptions } from '../idempotency.options.js';
import { IdempotencyStore } from './idempotency-store.js';
import { MemoryIdempotencyStore } from './memory/memory-idempotency.store.js';
import { RedisIdempotencyStore } from './redis/redis-idempotency.store.js';

/**
 * Client settings for a Redis connection the module opens itself: every command is bounded by
 * `commandTimeout`, and commands sent while disconnected fail at once instead of queueing, so an
 * outage turns into the configured fail-open / fail-closed answer rather than a hanging request.
 */
export const REDIS_CLIENT_DEFAULTS: RedisOptions = Object.freeze({
  commandTimeout: DEFAULTS.redisCommandTimeoutMs,
  connectTimeout: DEFAULTS.redisConnectTimeoutMs,
  enableOfflineQueue: false,
  maxRetriesPerRequest: 0,
});

/** Builds the store the module options describe. */
export function createStore(options: IdempotencyModuleOptions): IdempotencyStore {
  const { store } = options;
  if (store instanceof IdempotencyStore) return store;
  if (!store) {
    new Logger('IdempotencyModule').warn(
      'No store configured: using the in-memory store, which guards one process only. Configure Redis for more than one instance.',
    );
    return new MemoryIdempotencyStore({ maxEntries: options.memoryMaxEntries ?? DEFAULTS.memoryMaxEntries });
  }
  const { redis, waitForReplicas } = store;
  if (redis instanceof Redis || redis instanceof Cluster) return new RedisIdempotencyStore(redis, { waitForReplicas });
  const client =
    typeof redis === 'string'
      ? new Redis(redis, REDIS_CLIENT_DEFAULTS)
      : new Redis({ ...REDIS_CLIENT_DEFAULTS, ...redis });
  client.on('error', (error: Error) => new Logger('IdempotencyModule').warn(`Redis: ${error.message}`));
  return new RedisIdempotencyStore(client, { ownsClient: true, waitForReplicas });
}
