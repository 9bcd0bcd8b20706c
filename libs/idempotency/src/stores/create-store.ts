import { Logger } from '@nestjs/common';
import type { Cluster, Redis, RedisOptions } from 'ioredis';
import { IdempotencyConfigError } from '../errors/idempotency.errors.js';
import { DEFAULTS } from '../idempotency.constants.js';
import type { IdempotencyModuleOptions } from '../idempotency.options.js';
import { IdempotencyStore } from './idempotency-store.js';
import { coalesceWrites } from './redis/coalesce-writes.js';
import { withLocalCache } from './local-cache/local-cache.js';
import { resolveLocalCache } from './local-cache/local-cache-options.js';
import { MemoryIdempotencyStore } from './memory/memory-idempotency.store.js';
import { RedisIdempotencyStore } from './redis/redis-idempotency.store.js';

/**
 * Client settings for a Redis connection the module opens itself: commands sent while
 * disconnected fail at once instead of queueing, so an outage turns into the configured
 * fail-open / fail-closed answer rather than a hanging request. No `commandTimeout`: the store
 * bounds each command itself (1 s), and unlike ioredis's timeout its bound lets an answer that
 * arrived during a stall of the process win (see `withinDeadline`).
 */
export const REDIS_CLIENT_DEFAULTS: RedisOptions = Object.freeze({
  connectTimeout: DEFAULTS.redisConnectTimeoutMs,
  enableOfflineQueue: false,
  maxRetriesPerRequest: 0,
  reconnectOnError: reconnectOnReadOnly,
});

/**
 * A `READONLY` answer: the server the connection reached is a replica now (a failover promoted
 * another and demoted it, behind one address: a DNS name, a managed Redis's endpoint). The
 * connection reconnects, to the address's new primary; the command that met it fails (the
 * outage policy answers that request). Kept on the old connection, every claim failed for good:
 * under fail-open every new key ran once per instance, under fail-closed every one got 503
 * (an adversarial helper).
 */
function reconnectOnReadOnly(error: Error): boolean {
  return /\bREADONLY\b/.test(error.message);
}

/**
 * Builds the store the module options describe, behind the local cache when `localCache` asks
 * for it. ioredis (an optional peer) is loaded only here, when the module opens the Redis client
 * itself, so an app on another store never needs it.
 */
export async function createStore(options: IdempotencyModuleOptions): Promise<IdempotencyStore> {
  const cache = resolveLocalCache(options.localCache);
  const store = await createBackingStore(options);
  return cache ? withLocalCache(store, cache) : store;
}

async function createBackingStore(options: IdempotencyModuleOptions): Promise<IdempotencyStore> {
  const { store } = options;
  const keyPrefix = options.keyPrefix ?? DEFAULTS.keyPrefix;
  if (store instanceof IdempotencyStore) {
    if (store instanceof RedisIdempotencyStore) store.useKeyPrefix(keyPrefix);
    return store;
  }
  if (!store) {
    new Logger('IdempotencyModule').warn(
      'No store configured: using the in-memory store, which guards one process only. Configure Redis for more than one instance.',
    );
    return new MemoryIdempotencyStore({
      maxEntries: options.memoryMaxEntries ?? DEFAULTS.memoryMaxEntries,
      maxBytes: options.memoryMaxBytes ?? DEFAULTS.memoryMaxBytes,
    });
  }
  const { redis, waitForReplicas } = store;
  if (!redis) {
    // An unset REDIS_URL would otherwise connect to localhost:6379 without a word.
    throw new IdempotencyConfigError(
      `IdempotencyModule: store.redis is empty (${JSON.stringify(redis) ?? 'undefined'}): give a Redis URL, RedisOptions or a client (is REDIS_URL set?)`,
    );
  }
  if (isRedisClient(redis)) return new RedisIdempotencyStore(redis, { waitForReplicas, keyPrefix });
  const RedisClient = await loadRedisClass();
  // Connected in the store's onModuleInit, not here: an app that fails to start before its
  // lifecycle hooks (a refused configuration) leaves no connection open to keep its process alive.
  const client =
    typeof redis === 'string'
      ? new RedisClient(redis, { ...REDIS_CLIENT_DEFAULTS, lazyConnect: true })
      : new RedisClient({ ...REDIS_CLIENT_DEFAULTS, ...redis, lazyConnect: true });
  client.on('error', (error: Error) => new Logger('IdempotencyModule').warn(`Redis: ${error.message}`));
  coalesceWrites(client);
  return new RedisIdempotencyStore(client, { ownsClient: true, waitForReplicas, keyPrefix });
}

/** An ioredis `Redis` or `Cluster`, told from `RedisOptions` without loading ioredis (both have `isCluster`). */
function isRedisClient(value: unknown): value is Redis | Cluster {
  return (
    typeof value === 'object' &&
    value !== null &&
    typeof (value as { isCluster?: unknown }).isCluster === 'boolean' &&
    typeof (value as { defineCommand?: unknown }).defineCommand === 'function'
  );
}

async function loadRedisClass(): Promise<typeof Redis> {
  try {
    return (await import('ioredis')).Redis;
  } catch (error) {
    throw new IdempotencyConfigError('store: { redis } needs the ioredis package: npm install ioredis', { cause: error });
  }
}
