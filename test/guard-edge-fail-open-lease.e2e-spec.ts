// A fail-open run whose claim landed after all: Redis paused past the command bound, so the guard
// ran the handler unguarded, and the SET it had sent landed when the pause ended. That claim was
// never renewed, so it expired one lease later while the handler still ran, and a duplicate sent
// once Redis was healthy took the key and ran beside the first (every key of a burst, an
// adversarial helper). The guard now renews such a claim too: once a renewal lands, it holds the key.
// Its renewals went on only until the first lease ended, though, so a pause longer than a lease
// and the bound left the late claim to expire while the handler ran (a third helper round: 40 of
// 40 keys ran twice with a 3.5 s pause on a 2 s lease): they now go on until the handler settles.
import { afterAll, beforeAll, describe, expect, it } from '@jest/globals';
import { Controller, Post } from '@nestjs/common';
import { randomUUID } from 'node:crypto';
import type { Redis } from 'ioredis';
import { NoRepeatSubmit } from '../libs/idempotency/src/index.js';
import { startRedisServer, type RedisServer } from './support/redis-server.js';
import { connectRedis } from './support/services.js';
import { codeOf, makeApp, replayed, send, sleep, type EdgeApp } from './support/edge-app.js';

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

  @Post('long')
  @NoRepeatSubmit({ leaseSeconds: 2, failMode: 'open' })
  async createLong() {
    runs++;
    await sleep(7000);
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

  it('holds the key after an outage longer than a lease: a duplicate gets 409, a retry after the answer its replay', async () => {
    runs = 0;
    const key = randomUUID();
    // The claim lands at 4 s, two leases after the failed claim's, and expires at 6 s unless renewed.
    await admin.call('CLIENT', 'PAUSE', '4000', 'ALL');
    const first = send(a.url, '/orders/long', { headers: { 'idempotency-key': key }, body: {}, timeoutMs: 15_000 });
    await sleep(6500);
    const duplicate = await send(a.url, '/orders/long', { headers: { 'idempotency-key': key }, body: {}, timeoutMs: 10_000 });
    const answered = await first;
    const retry = await send(a.url, '/orders/long', { headers: { 'idempotency-key': key }, body: {}, timeoutMs: 15_000 });
    // Observed before: the duplicate 201 and the retry 201 unreplayed, runs 3.
    expect({
      first: answered.status,
      duplicate: [duplicate.status, codeOf(duplicate)],
      retry: [retry.status, replayed(retry)],
      runs,
    }).toEqual({ first: 201, duplicate: [409, 'IDEMPOTENCY_IN_PROGRESS'], retry: [201, true], runs: 1 });
  }, 30_000);
});
