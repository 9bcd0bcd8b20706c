// the store fails for a moment in the middle of a long handler, and answers
// again with a good part of the lease left. The README: "A renewal that fails is logged and
// counted, and tried again until the lease ends". That must keep the claim: no abort, no second
// run. The failure is real: Redis (a throwaway redis-server, so its settings touch no other test)
// refuses the renewal script at once, its user's ACL denying scripts for 1.8 s (NOPERM); it was
// out of memory (maxmemory under what it used) until renewals became allowed at maxmemory.
// Afterwards Redis answers 20 ms slower (a loopback proxy adds the latency: a busy Redis,
// another zone after a failover).
import { afterAll, beforeAll, describe, expect, it } from '@jest/globals';
import { Controller, Post } from '@nestjs/common';
import type { Redis } from 'ioredis';
import { randomUUID } from 'node:crypto';
import { IdempotencyCounters, LeaseSignal, NoRepeatSubmit } from '../libs/idempotency/src/index.js';
import { codeOf, makeApp, raw, sleep, type EdgeApp } from './support/edge-app.js';
import { startRedisServer, type RedisServer } from './support/redis-server.js';
import { connectRedis } from './support/services.js';
import { TcpProxy } from './support/tcp-proxy.js';

const LEASE_MS = 3000;
let runs = 0;
const errors: string[] = [];

@Controller()
class PayController {
  @Post('pay')
  @NoRepeatSubmit({ leaseSeconds: LEASE_MS / 1000 })
  async pay(@LeaseSignal() signal: AbortSignal) {
    const run = ++runs;
    await Promise.race([sleep(run === 1 ? 6000 : 10), new Promise((resolve) => signal.addEventListener('abort', resolve))]);
    return { aborted: signal.aborted };
  }
}

describe('Redis refusing the renewal script (an ACL) for 1.8 s in the middle of a handler that runs two leases (lease 3 s)', () => {
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
    await edge?.close();
    await proxy?.stop();
    admin?.disconnect();
    await server?.kill();
  });

  it('keeps the claim when the store answers again with 0.7 s of the lease left: no abort, no second run', async () => {
    runs = 0;
    const counters = edge.app.get(IdempotencyCounters);
    const key = randomUUID();
    const first = raw(edge.url, '/pay', { key, timeoutMs: 10_000 }).answer;
    while (runs === 0) await sleep(2);
    const startedAt = Date.now();
    // Renewals at 1 s (ok: the lease now ends at 4 s), then at 2 s and its retry at 3 s (both refused: NOPERM).
    await sleep(1500);
    await admin.call('ACL', 'SETUSER', 'default', '-evalsha', '-eval');
    await sleep(1800);
    await admin.call('ACL', 'SETUSER', 'default', '+@all');
    proxy.delayMs = 20;
    const backAt = Date.now() - startedAt;
    await sleep(4800 - backAt); // past the lease's end (4 s): a duplicate then
    const duplicate = await raw(edge.url, '/pay', { key }).answer;
    const answer = await first;
    expect(errors.some((e) => e.includes('could not renew the claim') && e.includes('NOPERM'))).toBe(true);
    expect({
      backWithLeaseLeft: backAt < 3500,
      first: JSON.parse(answer.text),
      duplicate: codeOf(duplicate) ?? duplicate.status,
      runs,
      lost: counters.leasesLost,
    }).toEqual({ backWithLeaseLeft: true, first: { aborted: false }, duplicate: 'IDEMPOTENCY_IN_PROGRESS', runs: 1, lost: 0 });
  }, 30_000);
});
