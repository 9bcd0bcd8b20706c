// Events of a caller that left before the guard answered it: an app's global TimeoutInterceptor
// (outside the guard) answers 408 while the claim is still under way. A decision that only
// answers the caller (fail_open, replayed, in_progress, key_reused) is counted and reported when
// the guard answers, so never for a caller already gone; what the claim did to the key (a
// store_error, a claim won) is reported whatever the caller does. Prometheus, IdempotencyCounters
// and the events keep the same totals.
import { afterAll, beforeAll, describe, expect, it } from '@jest/globals';
import {
  Body,
  Controller,
  Injectable,
  Post,
  RequestTimeoutException,
  type CallHandler,
  type ExecutionContext,
  type NestInterceptor,
} from '@nestjs/common';
import { createHash, randomUUID } from 'node:crypto';
import { Registry } from 'prom-client';
import { TimeoutError, catchError, throwError, timeout, type Observable } from 'rxjs';
import {
  IdempotencyCounters,
  IdempotencyStoreError,
  MemoryIdempotencyStore,
  NoRepeatSubmit,
  buildStorageKey,
  type ClaimInput,
  type ClaimResult,
  type IdempotencyEvent,
  type IdempotencyOutcome,
} from '../libs/idempotency/src/index.js';
import { codeOf, makeApp, raw, sleep, until, type Adapter, type EdgeApp } from './support/edge-app.js';

const TIMEOUT_MS = 150;

/** Nest docs' TimeoutInterceptor, global (outside the guard). */
class TimeoutInterceptor implements NestInterceptor {
  intercept(_ctx: ExecutionContext, next: CallHandler): Observable<unknown> {
    return next.handle().pipe(
      timeout(TIMEOUT_MS),
      catchError((error) => throwError(() => (error instanceof TimeoutError ? new RequestTimeoutException() : error))),
    );
  }
}

/** A memory store whose claims fail, after `failAfterMs` (a store that hangs, then times out), while it is set. */
class FlakyStore extends MemoryIdempotencyStore {
  failAfterMs: number | undefined;

  override async claim(input: ClaimInput): Promise<ClaimResult> {
    if (this.failAfterMs === undefined) return super.claim(input);
    await sleep(this.failAfterMs);
    throw new IdempotencyStoreError('claim timed out');
  }
}

@Injectable()
class Gate {
  runs = 0;
  private open: () => void = () => undefined;
  private opened: Promise<void> = Promise.resolve();
  hold(): void {
    this.opened = new Promise((resolve) => (this.open = resolve));
  }
  release(): void {
    this.open();
    this.opened = Promise.resolve();
  }
  async pass(): Promise<void> {
    this.runs++;
    await this.opened;
  }
}

@Controller('gone')
class GoneController {
  constructor(private readonly gate: Gate) {}

  @Post('open')
  @NoRepeatSubmit()
  async open(@Body() body: unknown) {
    await this.gate.pass();
    return { created: body };
  }

  @Post('wait')
  @NoRepeatSubmit({ waitForResultMs: 5000 })
  async wait(@Body() body: unknown) {
    await this.gate.pass();
    return { created: body };
  }
}

describe.each<Adapter>(['express', 'fastify'])('events of a caller gone before the answer (%s, global TimeoutInterceptor)', (adapter) => {
  const prefix = `events-gone-${adapter}-${randomUUID().slice(0, 6)}`;
  const store = new FlakyStore();
  const registry = new Registry();
  const seen: IdempotencyEvent[] = [];
  let edge: EdgeApp;
  let gate: Gate;

  beforeAll(async () => {
    edge = await makeApp(adapter, [GoneController], { store, keyPrefix: prefix, metrics: { registry }, onEvent: (e) => void seen.push(e) }, {
      providers: [Gate],
      setup: (app) => {
        app.useLogger(false);
        app.useGlobalInterceptors(new TimeoutInterceptor());
      },
    });
    gate = edge.app.get(Gate);
  });
  afterAll(async () => {
    store.failAfterMs = undefined;
    gate?.release();
    await edge?.close();
  });

  const hashOf = (method: string, key: string) =>
    createHash('sha256').update(buildStorageKey({ prefix, user: { anonymous: true }, handler: `GoneController.${method}`, key })).digest('hex');
  const typesOf = (method: string, key: string) =>
    seen
      .filter((e) => e.keyHash === hashOf(method, key) && e.type !== 'store_call')
      .map((e) => (e.type === 'in_progress' ? `in_progress:${e.waiting ? 'waiting' : 'refused'}` : e.type));

  it('a claim that fails after the caller left (fail-open route): store_error alone, no fail_open, and the handler never runs', async () => {
    const counters = edge.app.get(IdempotencyCounters);
    const key = randomUUID();
    const runs = gate.runs;
    store.failAfterMs = TIMEOUT_MS * 2;
    try {
      expect((await raw(edge.url, '/gone/open', { key, body: { n: 1 } }).answer).status).toBe(408);
      await until(() => typesOf('open', key).includes('store_error'));
    } finally {
      store.failAfterMs = undefined;
    }
    await sleep(50);
    expect(gate.runs).toBe(runs);
    expect(typesOf('open', key)).toEqual(['store_error']);
    expect(counters.failOpen).toBe(0);

    // The check can fail: a claim that fails while the caller is still there runs the handler unguarded.
    const other = randomUUID();
    store.failAfterMs = 0;
    try {
      expect((await raw(edge.url, '/gone/open', { key: other, body: { n: 1 } }).answer).status).toBe(201);
    } finally {
      store.failAfterMs = undefined;
    }
    expect(gate.runs).toBe(runs + 1);
    expect(typesOf('open', other)).toEqual(['store_error', 'fail_open']);
    expect(counters.failOpen).toBe(1);
  });

  it('a waiting duplicate cut off by the timeout: in_progress (waiting), then no replayed for it; a later retry is replayed', async () => {
    const key = randomUUID();
    gate.hold();
    const runs = gate.runs;
    const first = raw(edge.url, '/gone/wait', { key, body: { n: 2 } }).answer;
    await until(() => gate.runs === runs + 1);
    const duplicate = await raw(edge.url, '/gone/wait', { key, body: { n: 2 } }).answer;
    expect(duplicate.status).toBe(408);
    expect(typesOf('wait', key)).toEqual(['acquired', 'in_progress:waiting']);
    gate.release();
    expect((await first).status).toBe(408); // the first was cut off too: its answer is kept as not delivered
    await until(() => typesOf('wait', key).includes('completed'));
    await sleep(50);
    // The duplicate's wait ended with the saved answer after its caller had left: not a replay.
    expect(typesOf('wait', key)).toEqual(['acquired', 'in_progress:waiting', 'completed']);

    const retry = await raw(edge.url, '/gone/wait', { key, body: { n: 2 } }).answer;
    expect(codeOf(retry)).toBe('IDEMPOTENCY_RESPONSE_NOT_REPLAYABLE');
    expect(typesOf('wait', key)).toEqual(['acquired', 'in_progress:waiting', 'completed', 'replayed']);
  });

  it('Prometheus totals equal IdempotencyCounters and the events', async () => {
    const counters = edge.app.get(IdempotencyCounters);
    const metric = async (label: string) => {
      const { values } = await registry.getSingleMetric('idempotency_requests_total')!.get();
      return values.filter((s) => s.labels.outcome === label).reduce((sum, s) => sum + s.value, 0);
    };
    const count = (pick: (e: IdempotencyEvent) => boolean) => seen.filter(pick).length;
    const rows: [string, IdempotencyOutcome, (e: IdempotencyEvent) => boolean][] = [
      ['acquired', 'acquired', (e) => e.type === 'acquired'],
      ['replayed', 'replayed', (e) => e.type === 'replayed'],
      ['in_progress', 'inProgress', (e) => e.type === 'in_progress' && !e.waiting],
      ['waited', 'waited', (e) => e.type === 'in_progress' && e.waiting],
      ['released', 'released', (e) => e.type === 'released'],
      ['store_error', 'storeErrors', (e) => e.type === 'store_error'],
      ['fail_open', 'failOpen', (e) => e.type === 'fail_open'],
    ];
    for (const [label, outcome, pick] of rows) {
      expect([label, await metric(label), count(pick)]).toEqual([label, counters[outcome], counters[outcome]]);
    }
    expect(counters.replayed).toBe(1);
    expect(counters.failOpen).toBe(1);
  });
});
