// Duplicates waiting for the first result (`waitForResultMs`) when Redis stalls past the store's
// command bound (1 s) just as they look again. An adversarial helper (session 19): each waiter's
// look failed as an outage, and on the default fail-open route every waiter ran the handler beside
// the live first one (100 runs for one key, 4 of 4 runs, with a 1.8 s SIGSTOP of Redis). Waiters
// are known duplicates: a look that fails answers what the wait had, in progress (409). The stall
// here is CLIENT PAUSE ALL on a redis-server of the test's own.
import { afterAll, beforeAll, describe, expect, it } from '@jest/globals';
import { Controller, Injectable, Post } from '@nestjs/common';
import { randomUUID } from 'node:crypto';
import { IdempotencyCounters, NoRepeatSubmit } from '../libs/idempotency/src/index.js';
import { codeOf, makeApp, raw, replayed, sleep, until, type Adapter, type EdgeApp } from './support/edge-app.js';
import { startRedisServer, type RedisServer } from './support/redis-server.js';
import { connectRedis } from './support/services.js';

const LEASE_SECONDS = 6;
const WAITERS = 20;

/** Holds the handler until the test lets it go, and counts its runs. */
@Injectable()
class Gate {
  runs = 0;
  private open!: () => void;
  private opened = new Promise<void>((resolve) => (this.open = resolve));
  release(): void {
    this.open();
  }
  async run(): Promise<{ run: number }> {
    const run = ++this.runs;
    await this.opened;
    return { run };
  }
}

@Controller()
class WaitController {
  constructor(private readonly gate: Gate) {}

  @Post('waited')
  @NoRepeatSubmit({ waitForResultMs: 30_000, leaseSeconds: LEASE_SECONDS })
  waited() {
    return this.gate.run();
  }
}

describe.each<Adapter>(['express', 'fastify'])('waiting duplicates when Redis stalls past the command bound as they look again (%s)', (adapter) => {
  let server: RedisServer;
  let admin: Awaited<ReturnType<typeof connectRedis>>;
  let edge: EdgeApp;

  beforeAll(async () => {
    server = await startRedisServer();
    admin = await connectRedis(server.url);
    edge = await makeApp(adapter, [WaitController], { store: { redis: server.url } }, { providers: [Gate], setup: (app) => app.useLogger(false) });
  }, 20_000);
  afterAll(async () => {
    await edge?.close();
    admin?.disconnect();
    await server?.kill();
  });

  it('never runs a waiter beside the live first request: they get 409 IDEMPOTENCY_IN_PROGRESS or, once it ends, its answer', async () => {
    const gate = edge.app.get(Gate);
    const counters = edge.app.get(IdempotencyCounters);
    const key = randomUUID();
    const first = raw(edge.url, '/waited', { key, timeoutMs: 60_000 }).answer;
    await until(() => gate.runs === 1);
    const waitedBefore = counters.waited;
    const waiters = Array.from({ length: WAITERS }, () => raw(edge.url, '/waited', { key, timeoutMs: 60_000 }).answer);
    await until(() => counters.waited - waitedBefore === WAITERS, 10_000, 'every duplicate waiting');
    // Each waiter sleeps until the record's lease would end, as its claim read it, then looks
    // again: the pause covers that moment (the record's TTL now, less a second, for 3 s), and
    // ends while the first request's claim still has a renewed lease left.
    const [storageKey] = await admin.keys('*');
    const ttlMs = await admin.pttl(storageKey!);
    await sleep(Math.max(ttlMs - 1000, 0));
    await admin.call('CLIENT', 'PAUSE', '3000', 'ALL');
    await sleep(3500);
    expect(gate.runs).toBe(1);

    gate.release();
    const answers = await Promise.all([first, ...waiters]);
    expect(answers[0]!.status).toBe(201);
    const outcomes = answers.slice(1).map((answer) => (replayed(answer) ? 'replayed' : (codeOf(answer) ?? String(answer.status))));
    expect(outcomes.filter((outcome) => outcome !== 'replayed' && outcome !== 'IDEMPOTENCY_IN_PROGRESS')).toEqual([]);
    expect(gate.runs).toBe(1);
  }, 60_000);
});
