import { afterEach, describe, expect, it, jest } from '@jest/globals';
import { Logger } from '@nestjs/common';
import { Redis, type RedisOptions } from 'ioredis';
import { freePort } from '../../../../../test/support/redis-server.js';
import { RedisIdempotencyStore, type RedisIdempotencyStoreOptions } from './redis-idempotency.store.js';

/**
 * Behind Sentinel a failover loses the claims and answers the old primary took and had not
 * replicated: Sentinel demotes it seconds after it promoted the replica, and a client still on
 * it writes there meanwhile (an adversarial helper: a `SENTINEL FAILOVER` during a storm, 14 of
 * 16 keys ran twice, fail-closed, with no error; with `waitForReplicas`, none). Only waiting for
 * replicas closes that window, so the store says so at start-up. What is judged is the client's
 * configuration, so no Sentinel runs here: the client points at a port nobody listens on.
 */
describe('RedisIdempotencyStore behind Sentinel', () => {
  let client: Redis | undefined;
  afterEach(() => {
    client?.disconnect();
    client = undefined;
    jest.restoreAllMocks();
  });

  const warningsAtStart = async (clientOptions: RedisOptions, options: RedisIdempotencyStoreOptions = {}) => {
    client = new Redis({ lazyConnect: true, maxRetriesPerRequest: 0, retryStrategy: () => null, sentinelRetryStrategy: () => null, ...clientOptions });
    client.on('error', () => undefined);
    const warn = jest.spyOn(Logger.prototype, 'warn').mockImplementation(() => undefined);
    await new RedisIdempotencyStore(client, { readyTimeoutMs: 100, ...options }).onModuleInit();
    return warn.mock.calls.map(([message]) => String(message)).filter((message) => message.includes('Sentinel'));
  };

  it('warns at start-up that a failover loses claims, naming waitForReplicas and failoverDetector', async () => {
    const sentinels = [{ host: '127.0.0.1', port: await freePort() }];
    const warnings = await warningsAtStart({ sentinels, name: 'mymaster' });
    expect(warnings).toHaveLength(1);
    expect(warnings[0]).toContain('waitForReplicas');
    expect(warnings[0]).toContain('failoverDetector');
  });

  it('says nothing when the store waits for replicas, or the client does not go through Sentinel', async () => {
    const sentinels = [{ host: '127.0.0.1', port: await freePort() }];
    expect(await warningsAtStart({ sentinels, name: 'mymaster' }, { waitForReplicas: { replicas: 1, timeoutMs: 100 } })).toEqual([]);
    client?.disconnect();
    expect(await warningsAtStart({ host: '127.0.0.1', port: await freePort() })).toEqual([]);
  });
});
