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
import { Redis as IORedis, type Redis } from 'ioredis';
import { NoRepeatSubmit } from '../libs/idempotency/src/index.js';
import { startRedisServer, type RedisServer } from './support/redis-server.js';
import { connectRedis } from './support/services.js';
import { TcpProxy } from './support/tcp-proxy.js';
import { codeOf, makeApp, replayed, send, sleep, type EdgeApp } from './support/edge-app.js';

let runs = 0;
/** In a saved body: the client's queued commands that carry one are saves. */
const SAVE_MARKER = 'queued-save-marker';

@Controller('orders')
class OrdersController {
  @Post()
  @NoRepeatSubmit({ leaseSeconds: 2, failMode: 'open' })
  async create() {
    runs++;
    await sleep(4000);
    return { run: runs };
  }

  @Post('short')
  @NoRepeatSubmit({ leaseSeconds: 2, maxHoldSeconds: 30, failMode: 'open' })
  async createShort() {
    runs++;
    await sleep(1000);
    return { run: runs };
  }

  @Post('marked')
  @NoRepeatSubmit({ leaseSeconds: 3, maxHoldSeconds: 30, failMode: 'open' })
  async createMarked() {
    runs++;
    await sleep(100);
    return { marker: SAVE_MARKER, run: runs };
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

// A client handed in with ioredis's defaults keeps what it could not send: a command a dropped
// connection left unanswered is sent again on the next connection, before its offline queue,
// whose commands are dropped after 20 reconnect attempts. So a fail-open run's claim landed once
// Redis was back, after its handler had settled and its save had been dropped: the key stayed
// processing with nothing to complete it, duplicates got 409 for a lease, and then a retry ran
// the handler again (an adversarial helper: 40 of 40 keys ran twice). Its save is now tried again
// until maxHoldSeconds on such a client, and lands after the late claim.
describe('a fail-open run on a handed-in client that sends commands late', () => {
  let redis: RedisServer;
  let proxy: TcpProxy;
  let client: Redis;
  let a: EdgeApp;
  beforeAll(async () => {
    redis = await startRedisServer();
    proxy = await new TcpProxy({ host: '127.0.0.1', port: redis.port }).start();
    // ioredis's defaults, but for reconnecting every 50 ms (its default backs off to 2 s, and
    // drops the offline queue after some 10 s instead of 1 s).
    client = new IORedis(proxy.url, { retryStrategy: () => 50 });
    a = await makeApp('express', [OrdersController], { store: { redis: client } });
  }, 30_000);
  afterAll(async () => {
    await a?.close();
    client?.disconnect();
    await proxy?.stop();
    await redis?.kill();
  });

  it("completes the claim that lands after the handler settled: a retry gets the first run's replay", async () => {
    runs = 0;
    const key = randomUUID();
    // The claim goes out and is never answered; then the server is down behind a live address.
    proxy.swallowRequest = () => true;
    const first = send(a.url, '/orders/short', { headers: { 'idempotency-key': key }, body: {}, timeoutMs: 15_000 });
    await sleep(1200);
    proxy.refusing = true;
    proxy.cut();
    proxy.swallowRequest = undefined;
    const answered = await first;
    // Past the settled run (~2 s) and three drops of the offline queue (every 21 attempts, ~1 s).
    await sleep(3000);
    proxy.refusing = false;
    // The claim is sent again and lands (lease 2 s); past its lease, a retry.
    await sleep(4500);
    const retry = await send(a.url, '/orders/short', { headers: { 'idempotency-key': key }, body: {}, timeoutMs: 10_000 });
    // Observed before: the retry 201 unreplayed, runs 2.
    expect({ first: answered.status, retry: [retry.status, replayed(retry)], runs }).toEqual({ first: 201, retry: [201, true], runs: 1 });
  }, 30_000);

  // Each failed save was tried again on its own until the lease ended, and on this client every
  // try stayed in its queue with the whole body while Redis did not answer (an adversarial
  // helper: +2.7 MB of heap a second at 57 runs a second). The saves now wait for one probe.
  it('keeps one copy of each save in the client while Redis does not answer, and saves them all once it does', async () => {
    runs = 0;
    const keys = Array.from({ length: 10 }, () => randomUUID());
    proxy.swallowRequest = () => true;
    const answers = await Promise.all(keys.map((key) => send(a.url, '/orders/marked', { headers: { 'idempotency-key': key }, body: {}, timeoutMs: 15_000 })));
    await sleep(4000); // past the lease (3 s): every try a save would make
    const queued = (client as unknown as { commandQueue: { toArray(): Array<{ command: { args: unknown[] } }> } }).commandQueue.toArray();
    const offline = (client as unknown as { offlineQueue: { toArray(): Array<{ command: { args: unknown[] } }> } }).offlineQueue.toArray();
    const saves = [...queued, ...offline].filter((item) => item.command.args.some((arg) => String(arg).includes(SAVE_MARKER))).length;
    proxy.swallowRequest = undefined;
    proxy.cut(); // the client connects again and sends what it kept
    await sleep(3000);
    const retries = await Promise.all(keys.map((key) => send(a.url, '/orders/marked', { headers: { 'idempotency-key': key }, body: {}, timeoutMs: 10_000 })));
    // Observed before: 30 saves queued (3 a run).
    expect({
      answers: answers.map((answer) => answer.status),
      saves,
      retries: retries.map((retry) => [retry.status, replayed(retry)]),
      runs,
    }).toEqual({ answers: Array(10).fill(201), saves: 10, retries: Array(10).fill([201, true]), runs: 10 });
  }, 30_000);
});
