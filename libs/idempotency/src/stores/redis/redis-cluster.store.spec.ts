import { afterAll, beforeAll, describe, expect, it } from '@jest/globals';
import { Cluster } from 'ioredis';
import { randomUUID } from 'node:crypto';
import { startRedisCluster, type RedisCluster } from '../../../../../test/support/redis-cluster.js';
import { buildStorageKey } from '../../keys/storage-key.js';
import { describeStoreContract } from '../../testing/index.js';
import { RedisIdempotencyStore } from './redis-idempotency.store.js';

const sleep = (ms: number) => new Promise<void>((resolve) => setTimeout(resolve, ms));

describe('RedisIdempotencyStore on a 3-master Redis Cluster', () => {
  let cluster: RedisCluster;
  let client: Cluster;
  beforeAll(async () => {
    cluster = await startRedisCluster(3);
    client = new Cluster(cluster.nodes, { redisOptions: { maxRetriesPerRequest: 0, connectTimeout: 1000 } });
    await client.ping();
  }, 60_000);
  afterAll(async () => {
    await client?.quit();
    await cluster?.stop();
  });

  describeStoreContract(
    'redis cluster',
    async () => {
      const store = new RedisIdempotencyStore(client);
      const writeForeignValue = async (key: string) => {
        await client.set(key, 'Canada', 'PX', 60_000);
        return async () => (await client.get(key)) === 'Canada';
      };
      return { store, elapse: sleep, close: () => store.onApplicationShutdown(), writeForeignValue };
    },
    // A few round trips must fit in one lease: 200 ms did not on a loaded CI machine.
    500,
  );

  it('spreads records over the masters, each script touching one key', async () => {
    const store = new RedisIdempotencyStore(client);
    const keys = Array.from({ length: 30 }, (_, i) =>
      buildStorageKey({ prefix: 'no_repeat', user: { id: `u${i}` }, handler: 'Orders.create', key: randomUUID() }),
    );
    for (const key of keys) {
      expect((await store.claim({ key, token: 't', fingerprint: '', leaseMs: 5000 })).status).toBe('acquired');
      expect(await store.complete(key, 't', { statusCode: 201, headers: {}, body: '{}' }, 5000)).toBe(true);
    }
    const perMaster = await Promise.all(client.nodes('master').map((node) => node.dbsize()));
    expect(perMaster.filter((n) => n > 0).length).toBeGreaterThan(1);
  });
});
