// the store fails for a moment in the middle of a long handler, and answers
// again with a part of the lease left. The README: "A renewal that fails is logged and
// counted, and tried again until the lease ends". That must keep the claim: no abort, no second
// run. The failure is real: Redis (a throwaway redis-server, so its settings touch no other test)
// refuses the renewal script at once, its user's ACL denying scripts (NOPERM) for five renewals; it was
// out of memory (maxmemory under what it used) until renewals became allowed at maxmemory.
// Afterwards Redis answers 20 ms slower (a loopback proxy adds the latency: a busy Redis,
// another zone after a failover).
import { afterAll, beforeAll, describe, expect, it } from '@jest/globals';
import { Controller, Post } from '@nestjs/common';
import type { Redis } from 'ioredis';
import { randomUUID } from 'node:crypto';
import { IdempotencyCounters, LeaseSignal, NoRepeatSubmit } from '../libs/idempotency/src/index.js';
import { codeOf, makeApp, raw, sleep, until, type EdgeApp } from './support/edge-app.js';
import { startRedisServer, type RedisServer } from './support/redis-server.js';
import { connectRedis } from './support/services.js';
import { TcpProxy } from './support/tcp-proxy.js';

const LEASE_MS = 6000;
let runs = 0;
const errors: string[] = [];
// The first run works until the test has sent its duplicate (20 s at most). Every step of the
// test waits for what it needs (a renewal landed, renewals refused), not for a time: a loaded CI
// machine overran a fixed schedule with 200 ms of slack.
let endWork: () => void = () => undefined;
const workGate = () => new Promise<void>((resolve) => {
  endWork = resolve;
  setTimeout(resolve, 20_000).unref();
});

@Controller()
class PayController {
  @Post('pay')
  @NoRepeatSubmit({ leaseSeconds: LEASE_MS / 1000 })
  async pay(@LeaseSignal() signal: AbortSignal) {
    const run = ++runs;
    await Promise.race([run === 1 ? workGate() : sleep(10), new Promise((resolve) => signal.addEventListener('abort', resolve))]);
    return { aborted: signal.aborted };
  }
}

describe('Redis refusing the renewal script (an ACL) for five renewals in the middle of a handler that runs two leases (lease 6 s)', () => {
  let server: RedisServer;
  let admin: Redis;
  let proxy: TcpProxy;
  let edge: EdgeApp;

  beforeAll(async () => {
    server = await startRedisServer();
    admin = await connectRedis(server.url);
    proxy = await new TcpProxy({ host: '127.0.0.1', port: server.port }).start();
    edge = await makeApp('express', [PayController], { store: { redis: proxy.url } }, {
      setup: (app) => app.useLogger({ log() {}, warn: (m: unknown) => void errors.push(String(m)), error: (m: unknown) => void errors.push(String(m)) }),
    });
  }, 20_000);
  afterAll(async () => {
    endWork();
    await edge?.close();
    await proxy?.stop();
    admin?.disconnect();
    await server?.kill();
  });

  it('keeps the claim when the store answers again in the last third of the lease: no abort, no second run', async () => {
    runs = 0;
    const counters = edge.app.get(IdempotencyCounters);
    const renewed = counters.renewed;
    const key = randomUUID();
    const first = raw(edge.url, '/pay', { key, timeoutMs: 30_000 }).answer;
    const startedAt = Date.now();
    // The renewal at 2 s lands (the lease now ends at 8 s); from then on Redis refuses the script.
    await until(() => counters.renewed > renewed, 10_000, 'the first renewal');
    await admin.call('ACL', 'SETUSER', 'default', '-evalsha', '-eval');
    // The renewal at 4 s and its retries, 0.1, 0.3 and 0.7 s later, then 0.8 s later (~5.5 s): refused.
    const refused = () => errors.filter((e) => e.includes('could not renew the claim') && e.includes('NOPERM')).length;
    await until(() => refused() >= 5, 10_000, 'five refused renewals');
    await admin.call('ACL', 'SETUSER', 'default', '+@all');
    proxy.delayMs = 20;
    // Back while the claim still holds the key (the next retry, at ~6.75 s, lands with ~1.25 s left).
    const [storageKey] = await admin.keys('*');
    const leftWhenBack = await admin.pttl(storageKey);
    await until(() => counters.renewed > renewed + 1, 10_000, 'a renewal after the store answers again');
    // Past the end of the lease the refused renewals left (8 s): a duplicate then.
    await sleep(Math.max(8300 - (Date.now() - startedAt), 0));
    const duplicate = await raw(edge.url, '/pay', { key }).answer;
    endWork();
    const answer = await first;
    expect({
      backWithLeaseLeft: leftWhenBack > 0,
      first: JSON.parse(answer.text),
      duplicate: codeOf(duplicate) ?? duplicate.status,
      runs,
      lost: counters.leasesLost,
    }).toEqual({ backWithLeaseLeft: true, first: { aborted: false }, duplicate: 'IDEMPOTENCY_IN_PROGRESS', runs: 1, lost: 0 });
  }, 60_000);
});
