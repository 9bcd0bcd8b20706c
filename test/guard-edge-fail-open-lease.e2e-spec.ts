// A fail-open run whose claim landed after all: Redis paused past the command bound, so the guard
// ran the handler unguarded, and the SET it had sent landed when the pause ended. That claim was
// never renewed, so it expired one lease later while the handler still ran, and a duplicate sent
// once Redis was healthy took the key and ran beside the first (every key of a burst, an
// adversarial helper). The guard now renews such a claim too: once a renewal lands, it holds the key.
import { afterAll, beforeAll, describe, expect, it } from '@jest/globals';
import { Controller, Post } from '@nestjs/common';
import { randomUUID } from 'node:crypto';
import type { Redis } from 'ioredis';
import { NoRepeatSubmit } from '../libs/idempotency/src/index.js';
import { startRedisServer, type RedisServer } from './support/redis-server.js';
import { connectRedis } from './support/services.js';
import { codeOf, makeApp, send, sleep, type EdgeApp } from './support/edge-app.js';

let runs = 0;

@Controller('orders')
class OrdersController {
  @Post()
  @NoRepeatSubmit({ leaseSeconds: 2, failMode: 'open' })
  async create() {
    runs++;
    await sleep(4000);
    return { run: runs };
  }
}

describe('a fail-open run whose claim landed late', () => {
  let redis: RedisServer;
  let admin: Redis;
  let a: EdgeApp;
  beforeAll(async () => {
    redis = await startRedisServer();
    admin = await connectRedis(redis.url);
    a = await makeApp('express', [OrdersController], { store: { redis: redis.url } });
  }, 30_000);
  afterAll(async () => {
    await a?.close();
    admin?.disconnect();
    await redis?.kill();
  });

  it('holds the key once Redis is back: a duplicate after the first lease gets 409, and the handler runs once', async () => {
    runs = 0;
    const key = randomUUID();
    await admin.call('CLIENT', 'PAUSE', '1500', 'ALL');
    const first = send(a.url, '/orders', { headers: { 'idempotency-key': key }, body: {}, timeoutMs: 15_000 });
    // Past the pause, the bound (1 s) and the first lease (2 s): Redis has answered for a while.
    await sleep(4000);
    const duplicate = await send(a.url, '/orders', { headers: { 'idempotency-key': key }, body: {} });
    const answered = await first;
    // Observed before: the duplicate 201 (a second run beside the first), runs 2.
    expect({ first: answered.status, duplicate: [duplicate.status, codeOf(duplicate)], runs }).toEqual({
      first: 201,
      duplicate: [409, 'IDEMPOTENCY_IN_PROGRESS'],
      runs: 1,
    });
  }, 20_000);
});
