// A stall of the process (a GC pause, a CPU-starved container) shorter than a lease, that starts
// right after a renewal was sent and ends past the old lease's end. Redis renewed the claim; Node
// runs the overdue lease deadline before it reads the renewal's answer, and the guard took the
// claim for lost: renewals stopped, the key freed a lease later, and a duplicate ran the handler
// again (found by an adversarial helper on two instances). The stall is injected into the real
// Redis store, just after it sent the renewal: the one place a test can time it exactly.
import { afterAll, beforeAll, describe, expect, it } from '@jest/globals';
import { Controller, Post } from '@nestjs/common';
import { randomUUID } from 'node:crypto';
import { LeaseSignal, NoRepeatSubmit, RedisIdempotencyStore } from '../libs/idempotency/src/index.js';
import { codeOf, makeApp, raw, replayed, sleep, type EdgeApp } from './support/edge-app.js';
import { connectRedis } from './support/services.js';

/** Busy for `ms`: no timer and no socket is served meanwhile. */
const stall = (ms: number) => {
  const until = Date.now() + ms;
  while (Date.now() < until);
};

/**
 * The Redis store; when armed, the process stalls once after it sent a renewal: in the renewal's
 * own callback (the next renewal must then go sooner: less of the renewed lease is left), or in
 * the next callback (another request's work, a collection), in the loop's check phase, so that
 * the next turn starts with due timers, before the sockets are read.
 */
class StallingStore extends RedisIdempotencyStore {
  stall?: { ms: number; where: 'own' | 'next' };
  override renew(key: string, token: string, leaseMs: number): Promise<boolean> {
    const sent = super.renew(key, token, leaseMs);
    const armed = this.stall;
    this.stall = undefined;
    if (armed?.where === 'own') stall(armed.ms);
    if (armed?.where === 'next') setImmediate(() => stall(armed.ms));
    return sent;
  }
}

let runs = 0;
// The first run works until the test has sent its duplicate (20 s at most): a fixed 3.5 s left a
// loaded CI machine ~1 s to send it.
let endWork: () => void = () => undefined;
const workGate = () => new Promise<void>((resolve) => {
  endWork = resolve;
  setTimeout(resolve, 20_000).unref();
});

@Controller()
class PayController {
  // Lease 6 s: the first renewal goes at 2 s; a 4.5 s stall after it ends at 6.5 s, past the old
  // lease's end (6 s) and within the renewed one (8 s), which the next renewal then has 1.5 s to
  // reach (0.8 s of a 3 s lease was overrun once, by a CI run sharing the machine with others).
  @Post('pay')
  @NoRepeatSubmit({ leaseSeconds: 6 })
  async pay(@LeaseSignal() signal: AbortSignal) {
    const run = ++runs;
    await (run === 1 ? workGate() : sleep(10));
    return { aborted: signal.aborted };
  }
}

describe('a stall past the lease\'s end, just after a renewal Redis took (Redis store)', () => {
  let edge: EdgeApp;
  let store: StallingStore;
  let redis: Awaited<ReturnType<typeof connectRedis>>;
  beforeAll(async () => {
    // No commandTimeout of the client's own (the test client's is 2 s): ioredis's timer fires after a
    // longer stall before the reply is read, and the renewal counts as failed; the store's own
    // bound, which waits one turn past its timer, is the one under test here.
    redis = await connectRedis(undefined, { commandTimeout: undefined });
    store = new StallingStore(redis);
    edge = await makeApp('express', [PayController], { store, keyPrefix: `stall-${randomUUID().slice(0, 8)}` }, { setup: (app) => app.useLogger(false) });
  });
  afterAll(async () => {
    endWork();
    await edge?.close();
    redis?.disconnect();
  });

  it.each(['own', 'next'] as const)(
    'keeps the claim (stall in the %s callback): a duplicate after the stall gets 409, then the replay; one run',
    async (where) => {
      runs = 0;
      const key = randomUUID();
      store.stall = { ms: 4500, where };
      const first = raw(edge.url, '/pay', { key, timeoutMs: 30_000 }).answer;
      // Past the stall (6.5 s) and past where a lost claim's key frees (its last lease, 8 s).
      await sleep(8800);
      const duplicate = await raw(edge.url, '/pay', { key }).answer;
      endWork();
      expect(codeOf(duplicate)).toBe('IDEMPOTENCY_IN_PROGRESS');
      const answer = await first;
      expect({ status: answer.status, body: JSON.parse(answer.text) }).toEqual({ status: 201, body: { aborted: false } });
      const again = await raw(edge.url, '/pay', { key }).answer;
      expect({ status: again.status, replayed: replayed(again), text: again.text }).toEqual({ status: 201, replayed: true, text: answer.text });
      expect(runs).toBe(1);
    },
    40_000,
  );
});
