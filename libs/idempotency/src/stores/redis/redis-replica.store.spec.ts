import { afterAll, beforeAll, describe, expect, it } from '@jest/globals';
import type { Redis } from 'ioredis';
import { randomUUID } from 'node:crypto';
import { startRedisServer, type RedisServer } from '../../../../../test/support/redis-server.js';
import { connectRedis } from '../../../../../test/support/services.js';
import { TcpProxy } from '../../../../../test/support/tcp-proxy.js';
import { createStore } from '../create-store.js';
import { IdempotencyStoreError } from '../../errors/idempotency.errors.js';
import { RedisIdempotencyStore } from './redis-idempotency.store.js';

describe('RedisIdempotencyStore with waitForReplicas (a primary and a replica the test starts)', () => {
  let primary: RedisServer;
  let replica: RedisServer;
  let client: Redis;
  let replicaClient: Redis;

  beforeAll(async () => {
    primary = await startRedisServer();
    replica = await startRedisServer(undefined, ['--replicaof', '127.0.0.1', String(primary.port)]);
    client = await connectRedis(primary.url);
    replicaClient = await connectRedis(replica.url);
    const deadline = Date.now() + 10_000;
    while (!(await replicaClient.info('replication')).includes('master_link_status:up')) {
      if (Date.now() > deadline) throw new Error('the replica did not connect to the primary');
      await new Promise((resolve) => setTimeout(resolve, 50));
    }
  }, 30_000);
  afterAll(async () => {
    client?.disconnect();
    replicaClient?.disconnect();
    await replica?.kill();
    await primary?.kill();
  });

  it('returns a claim only once the replica has it', async () => {
    const store = new RedisIdempotencyStore(client, { waitForReplicas: { replicas: 1, timeoutMs: 2000 } });
    const key = `replicated:${randomUUID()}`;
    expect((await store.claim({ key, token: 't', fingerprint: '', leaseMs: 60_000 })).status).toBe('acquired');
    const onReplica = new RedisIdempotencyStore(replicaClient);
    expect(await onReplica.get(key)).toMatchObject({ state: 'processing', token: 't' });
    expect(await store.complete(key, 't', { statusCode: 201, headers: {}, body: '1' }, 60_000)).toBe(true);
    expect(await onReplica.get(key)).toMatchObject({ state: 'completed', token: 't' });
  });

  it('returns a renewal once the replica has the new lease', async () => {
    const store = new RedisIdempotencyStore(client, { waitForReplicas: { replicas: 1, timeoutMs: 2000 } });
    const key = `renewed:${randomUUID()}`;
    expect((await store.claim({ key, token: 't', fingerprint: '', leaseMs: 1_000 })).status).toBe('acquired');
    expect(await store.renew(key, 't', 60_000)).toBe(true);
    expect(await replicaClient.pttl(key)).toBeGreaterThan(59_000);
    expect(await store.renew(key, 'other', 120_000)).toBe(false);
    expect(await replicaClient.pttl(key)).toBeLessThanOrEqual(60_000);
  });

  // An adversarial helper: a completion the replica never got was only logged, the guard sent its
  // 201, and after a failover the promoted replica held the claim: a retry got 409, then ran the
  // handler again once the lease ended (4 of 4 runs). A save not acknowledged now fails, and the
  // guard tries it again until the lease ends (the same save, sent again, answers 1 and waits again).
  it('fails a completion too few replicas acknowledge, and takes the same save again once they do', async () => {
    const key = `unreplicated-save:${randomUUID()}`;
    const strict = new RedisIdempotencyStore(client, { waitForReplicas: { replicas: 2, timeoutMs: 100 } });
    const store = new RedisIdempotencyStore(client, { waitForReplicas: { replicas: 1, timeoutMs: 2000 } });
    expect((await store.claim({ key, token: 't', fingerprint: '', leaseMs: 60_000 })).status).toBe('acquired');
    const saved = { statusCode: 201, headers: {}, body: '1' };
    await expect(strict.complete(key, 't', saved, 60_000)).rejects.toThrow(/Only 1 of 2 replicas acknowledged the write/);
    expect(await store.complete(key, 't', saved, 60_000)).toBe(true);
    expect(await new RedisIdempotencyStore(replicaClient).get(key)).toMatchObject({ state: 'completed', token: 't' });
  });

  it('releases the claim and reports a store error when too few replicas acknowledge it', async () => {
    const store = new RedisIdempotencyStore(client, { waitForReplicas: { replicas: 2, timeoutMs: 100 } });
    const key = `unreplicated:${randomUUID()}`;
    await expect(store.claim({ key, token: 't', fingerprint: '', leaseMs: 60_000 })).rejects.toThrow(
      IdempotencyStoreError,
    );
    expect(await client.exists(key)).toBe(0);
  });
});

// A failover behind one address (a DNS name, a managed Redis's endpoint): the replica promoted,
// the old primary made its replica, the address now leading to the new primary. The client the
// module opened stayed on its connection to the old primary, and every claim failed READONLY for
// good (an adversarial helper: every new key ran once per instance under fail-open, 503 under
// fail-closed, 40 s on).
describe('the client the module opens, across a failover behind one address', () => {
  let first: RedisServer;
  let second: RedisServer;
  let proxy: TcpProxy;
  beforeAll(async () => {
    first = await startRedisServer();
    second = await startRedisServer(undefined, ['--replicaof', '127.0.0.1', String(first.port)]);
    proxy = await new TcpProxy({ host: '127.0.0.1', port: first.port }).start();
  }, 30_000);
  afterAll(async () => {
    await proxy?.stop();
    await second?.kill();
    await first?.kill();
  });

  it('claims on the new primary once a command has met READONLY', async () => {
    const store = (await createStore({ store: { redis: proxy.url } })) as RedisIdempotencyStore;
    await store.onModuleInit();
    try {
      expect((await store.claim({ key: `before:${randomUUID()}`, token: 't', fingerprint: '', leaseMs: 60_000 })).status).toBe('acquired');
      const promoted = await connectRedis(second.url);
      const demoted = await connectRedis(first.url);
      await promoted.replicaof('NO', 'ONE');
      proxy.retarget({ host: '127.0.0.1', port: second.port });
      await demoted.replicaof('127.0.0.1', String(second.port));
      promoted.disconnect();
      demoted.disconnect();
      const outcomes: string[] = [];
      for (let i = 0; i < 20; i++) {
        const claim = store.claim({ key: `after:${randomUUID()}`, token: 't', fingerprint: '', leaseMs: 60_000 });
        outcomes.push(await claim.then((r) => r.status, (error: Error) => (/READONLY/.test(error.message) ? 'readonly' : 'failed')));
        await new Promise((resolve) => setTimeout(resolve, 50));
      }
      // Observed before: readonly × 20.
      expect({ readonly: outcomes.filter((o) => o === 'readonly').length <= 1, last: outcomes.slice(-10) }).toEqual({
        readonly: true,
        last: Array(10).fill('acquired'),
      });
    } finally {
      await store.onApplicationShutdown();
    }
  });
});
