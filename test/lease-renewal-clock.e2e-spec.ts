// the wall clock steps (NTP step, VM resumed, an operator's `date -s`) while a
// handler runs. Redis keeps its TTLs by its own clock, and the memory store by the monotonic
// one, so the claim in the store is unaffected; the guard's renewal schedule must not be either. A real clock step needs CAP_SYS_TIME and would
// move the clock of every process on this machine, so this spec steps Date.now() in this process
// only (the one thing the guard reads), and leaves timers, Redis and the network real.
import { afterAll, afterEach, beforeAll, describe, expect, it } from '@jest/globals';
import { Controller, Post } from '@nestjs/common';
import { randomUUID } from 'node:crypto';
import { IdempotencyCounters, LeaseSignal, NoRepeatSubmit } from '../libs/idempotency/src/index.js';
import { codeOf, makeApp, raw, sleep, type EdgeApp } from './support/edge-app.js';
import { REDIS_URL } from './support/services.js';

const realNow = Date.now.bind(Date);
let offsetMs = 0;
const stepClock = (ms: number) => {
  offsetMs += ms;
  Date.now = () => realNow() + offsetMs;
};

let runs = 0;
// The /forward handler works until the test has sent its duplicate (20 s at most).
let endWork: () => void = () => undefined;
const workGate = () => new Promise<void>((resolve) => {
  endWork = resolve;
  setTimeout(resolve, 20_000).unref();
});

// Leases of seconds, not tenths: a loaded CI machine stalled this process past a 0.6 s lease, and
// the claim was really lost (the test is about clock steps, not stalls).
@Controller()
class ClockController {
  @Post('forward')
  @NoRepeatSubmit({ leaseSeconds: 3 })
  async forward(@LeaseSignal() signal: AbortSignal) {
    runs++;
    await Promise.race([workGate(), new Promise((resolve) => signal.addEventListener('abort', resolve))]);
    return { aborted: signal.aborted };
  }

  @Post('kept')
  @NoRepeatSubmit({ expireSeconds: 60 })
  kept() {
    runs++;
    return { run: runs };
  }

  @Post('backward')
  @NoRepeatSubmit({ leaseSeconds: 1, maxHoldSeconds: 3 })
  async backward(@LeaseSignal() signal: AbortSignal) {
    runs++;
    await Promise.race([sleep(25_000), new Promise((resolve) => signal.addEventListener('abort', resolve))]);
    return { aborted: signal.aborted };
  }
}

describe.each([
  ['Redis', { store: { redis: REDIS_URL } }],
  ['memory', {}],
])('wall-clock steps while a handler holds its claim (%s store)', (_name, storeOptions) => {
  let edge: EdgeApp;
  let counters: IdempotencyCounters;
  beforeAll(async () => {
    edge = await makeApp('express', [ClockController], { ...storeOptions, keyPrefix: `clock-${randomUUID()}` }, { setup: (app) => app.useLogger(false) });
    counters = edge.app.get(IdempotencyCounters);
  });
  afterEach(() => {
    Date.now = realNow;
    offsetMs = 0;
  });
  afterAll(() => {
    endWork();
    return edge?.close();
  });

  it('a clock stepped forward by an hour neither aborts the LeaseSignal nor drops the claim', async () => {
    runs = 0;
    const lostBefore = counters.leasesLost;
    const key = randomUUID();
    const first = raw(edge.url, '/forward', { key, timeoutMs: 15_000 }).answer;
    while (runs === 0) await sleep(5);
    await sleep(300);
    stepClock(3_600_000);
    await sleep(6500); // two leases later: the claim should still be renewed
    const duplicate = await raw(edge.url, '/forward', { key }).answer;
    endWork();
    const answer = await first;
    expect({
      first: JSON.parse(answer.text),
      duplicate: codeOf(duplicate) ?? duplicate.status,
      runs,
      lost: counters.leasesLost - lostBefore,
    }).toEqual({ first: { aborted: false }, duplicate: 'IDEMPOTENCY_IN_PROGRESS', runs: 1, lost: 0 });
  }, 30_000);

  it('a clock stepped forward by an hour keeps a completed record for its retention (the duplicate is replayed)', async () => {
    runs = 0;
    const key = randomUUID();
    const first = await raw(edge.url, '/kept', { key }).answer;
    stepClock(3_600_000);
    const duplicate = await raw(edge.url, '/kept', { key }).answer;
    expect({ replayed: duplicate.headers['idempotent-replayed'], body: duplicate.text, runs }).toEqual({
      replayed: 'true',
      body: first.text,
      runs: 1,
    });
  });

  it('a clock stepped back by an hour still ends the claim at maxHoldSeconds', async () => {
    runs = 0;
    const key = randomUUID();
    const started = realNow();
    const first = raw(edge.url, '/backward', { key, timeoutMs: 30_000 }).answer;
    while (runs === 0) await sleep(5);
    await sleep(100);
    stepClock(-3_600_000);
    const answer = await first;
    // maxHoldSeconds is 3 s: the signal aborts then (one lease's slack), not after the handler's
    // 25 s; the 12 s bound leaves a loaded machine 8 s.
    expect({ first: JSON.parse(answer.text), endedWithinMs: realNow() - started < 12_000 }).toEqual({
      first: { aborted: true },
      endedWithinMs: true,
    });
  }, 30_000);
});
