// Exactly one event of the right type per outcome per call, in the apps users write
// (an outer TimeoutInterceptor, clients that leave, waitForResultMs, saveStatuses, unreplayable
// records), on Express and Fastify with Redis; and the Prometheus totals equal to
// IdempotencyCounters and to the events.
import { afterAll, beforeAll, describe, expect, it } from '@jest/globals';
import {
  Body,
  Controller,
  Injectable,
  Post,
  RequestTimeoutException,
  UnprocessableEntityException,
  type CallHandler,
  type ExecutionContext,
  type NestInterceptor,
} from '@nestjs/common';
import type { Redis } from 'ioredis';
import { createHash, randomUUID } from 'node:crypto';
import { Registry } from 'prom-client';
import { TimeoutError, catchError, throwError, timeout, type Observable } from 'rxjs';
import {
  IdempotencyCounters,
  LeaseSignal,
  NoRepeatSubmit,
  RedisIdempotencyStore,
  buildStorageKey,
  type IdempotencyEvent,
  type IdempotencyOutcome,
} from '../libs/idempotency/src/index.js';
import { codeOf, makeApp, raw, replayed, sleep, until, type Adapter, type EdgeApp } from './support/edge-app.js';
import { freePort } from './support/redis-server.js';
import { connectRedis } from './support/services.js';

// Every request meant to time out is held by the gate, so the bound only has to exceed what an
// answered request takes on a loaded machine (150 ms left a waiting duplicate ~90 ms).
const TIMEOUT_MS = 1000;

/** Nest docs' TimeoutInterceptor, global (outside the guard). */
class TimeoutInterceptor implements NestInterceptor {
  intercept(_ctx: ExecutionContext, next: CallHandler): Observable<unknown> {
    return next.handle().pipe(
      timeout(TIMEOUT_MS),
      catchError((error) => throwError(() => (error instanceof TimeoutError ? new RequestTimeoutException() : error))),
    );
  }
}

@Injectable()
class Gate {
  started = 0;
  settled = 0;
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
    this.started++;
    try {
      await this.opened;
    } finally {
      this.settled++;
    }
  }
}

@Controller('o')
class OutcomesController {
  constructor(private readonly gate: Gate) {}

  @Post('run')
  @NoRepeatSubmit()
  async run(@Body() body: unknown) {
    await this.gate.pass();
    return { created: body };
  }

  @Post('fail')
  @NoRepeatSubmit()
  async fail() {
    await this.gate.pass();
    throw new UnprocessableEntityException({ code: 'NOPE' });
  }

  @Post('saved-fail')
  @NoRepeatSubmit({ saveStatuses: [422] })
  async savedFail() {
    await this.gate.pass();
    throw new UnprocessableEntityException({ code: 'NOPE' });
  }

  /**
   * Renewed every second; answers once the gate opens or the claim is lost. A lease of seconds:
   * a loaded machine's stall ended a 0.3 s one before its first renewal.
   */
  @Post('leased')
  @NoRepeatSubmit({ leaseSeconds: 3 })
  async leased(@LeaseSignal() signal: AbortSignal) {
    await Promise.race([this.gate.pass(), new Promise((resolve) => signal.addEventListener('abort', resolve))]);
    return { aborted: signal.aborted };
  }

  @Post('wait')
  @NoRepeatSubmit({ waitForResultMs: 60 })
  async wait(@Body() body: unknown) {
    await this.gate.pass();
    return { created: body };
  }
}

describe.each<Adapter>(['express', 'fastify'])('one event per outcome (%s, Redis, global TimeoutInterceptor)', (adapter) => {
  const prefix = `rv-outcomes-${adapter}-${randomUUID().slice(0, 6)}`;
  let edge: EdgeApp;
  let redis: Redis;
  let gate: Gate;
  const registry = new Registry();
  const seen: IdempotencyEvent[] = [];

  beforeAll(async () => {
    redis = await connectRedis();
    edge = await makeApp(
      adapter,
      [OutcomesController],
      { store: new RedisIdempotencyStore(redis), keyPrefix: prefix, metrics: { registry }, onEvent: (event) => void seen.push(event) },
      {
        providers: [Gate],
        setup: (app) => {
          app.useLogger(false);
          app.useGlobalInterceptors(new TimeoutInterceptor());
        },
      },
    );
    gate = edge.app.get(Gate);
  });
  afterAll(async () => {
    gate?.release();
    await edge?.close();
    redis?.disconnect();
  });

  const hashOf = (method: string, key: string) =>
    createHash('sha256').update(buildStorageKey({ prefix, user: { anonymous: true }, handler: `OutcomesController.${method}`, key })).digest('hex');
  const typesOf = (method: string, key: string) =>
    seen.filter((e) => e.keyHash === hashOf(method, key) && e.type !== 'store_call').map((e) => e.type);
  const settledOf = async (before: number) => until(() => gate.settled > before);

  it('a timeout answering before the handler settles: acquired, then completed (not_delivered); a retry: replayed (unreplayable, 409)', async () => {
    const key = randomUUID();
    gate.hold();
    const before = gate.settled;
    const first = await raw(edge.url, '/o/run', { key, body: { n: 1 } }).answer;
    expect(first.status).toBe(408);
    gate.release();
    await settledOf(before);
    await until(() => typesOf('run', key).includes('completed'));
    const again = await raw(edge.url, '/o/run', { key, body: { n: 1 } }).answer;
    expect(codeOf(again)).toBe('IDEMPOTENCY_RESPONSE_NOT_REPLAYABLE');
    expect(typesOf('run', key)).toEqual(['acquired', 'completed', 'replayed']);
    const events = seen.filter((e) => e.keyHash === hashOf('run', key));
    expect(events.find((e) => e.type === 'completed')).toMatchObject({ unreplayable: 'not_delivered' });
    expect(events.find((e) => e.type === 'replayed')).toMatchObject({ unreplayable: 'not_delivered' });
  });

  it('a handler that fails after the timeout answered: acquired, released, once each', async () => {
    const key = randomUUID();
    gate.hold();
    const before = gate.settled;
    expect((await raw(edge.url, '/o/fail', { key }).answer).status).toBe(408);
    gate.release();
    await settledOf(before);
    await until(() => typesOf('fail', key).includes('released'));
    await sleep(50);
    expect(typesOf('fail', key)).toEqual(['acquired', 'released']);
  });

  it('a client that disconnects mid-request, then the handler succeeds: acquired, completed, once each', async () => {
    const key = randomUUID();
    gate.hold();
    const before = gate.settled;
    const startedBefore = gate.started;
    const call = raw(edge.url, '/o/run', { key, body: { n: 2 } });
    await until(() => gate.started > startedBefore);
    call.abort();
    await call.answer;
    await sleep(20);
    gate.release();
    await settledOf(before);
    await until(() => typesOf('run', key).some((t) => t === 'completed' || t === 'released' || t === 'lease_takeover'));
    await sleep(50);
    expect(typesOf('run', key)).toEqual(['acquired', 'completed']);
  });

  it('a client that disconnects mid-request, then the handler fails with a saved status: acquired, completed, once each', async () => {
    const key = randomUUID();
    gate.hold();
    const before = gate.settled;
    const startedBefore = gate.started;
    const call = raw(edge.url, '/o/saved-fail', { key });
    await until(() => gate.started > startedBefore);
    call.abort();
    await call.answer;
    await sleep(20);
    gate.release();
    await settledOf(before);
    await until(() => typesOf('savedFail', key).some((t) => t === 'completed' || t === 'released'));
    await sleep(50);
    // Its 422 is a saved status: the answer the app gave is saved, as for a success.
    expect(typesOf('savedFail', key)).toEqual(['acquired', 'completed']);
  });

  it('a client that disconnects mid-request, then the handler fails: acquired, released, once each', async () => {
    const key = randomUUID();
    gate.hold();
    const before = gate.settled;
    const startedBefore = gate.started;
    const call = raw(edge.url, '/o/fail', { key });
    await until(() => gate.started > startedBefore);
    call.abort();
    await call.answer;
    await sleep(20);
    gate.release();
    await settledOf(before);
    await until(() => typesOf('fail', key).some((t) => t === 'completed' || t === 'released'));
    await sleep(50);
    expect(typesOf('fail', key)).toEqual(['acquired', 'released']);
  });

  it('saveStatuses: a 422 of the method is completed with its status, and replayed', async () => {
    const key = randomUUID();
    expect((await raw(edge.url, '/o/saved-fail', { key }).answer).status).toBe(422);
    const again = await raw(edge.url, '/o/saved-fail', { key }).answer;
    expect(replayed(again)).toBe(true);
    expect(typesOf('savedFail', key)).toEqual(['acquired', 'completed', 'replayed']);
    expect(seen.find((e) => e.keyHash === hashOf('savedFail', key) && e.type === 'completed')).toMatchObject({ statusCode: 422 });
  });

  it('a waiting duplicate that times out at waitForResultMs: in_progress (waiting), then in_progress (not waiting), 409', async () => {
    const key = randomUUID();
    gate.hold();
    const startedBefore = gate.started;
    const first = raw(edge.url, '/o/wait', { key, body: { n: 3 } }).answer;
    await until(() => gate.started > startedBefore);
    const dup = await raw(edge.url, '/o/wait', { key, body: { n: 3 } }).answer;
    expect(codeOf(dup)).toBe('IDEMPOTENCY_IN_PROGRESS');
    gate.release();
    await first;
    const waits = seen.filter((e) => e.keyHash === hashOf('wait', key) && e.type === 'in_progress');
    expect(waits.map((e) => e.type === 'in_progress' && e.waiting)).toEqual([true, false]);
  });

  it('a lease lost under the running handler (its key deleted): renewed, then lease_lost and lease_takeover once each', async () => {
    const key = randomUUID();
    gate.hold();
    const answer = raw(edge.url, '/o/leased', { key }).answer;
    await until(() => typesOf('leased', key).includes('renewed'));
    await redis.del(buildStorageKey({ prefix, user: { anonymous: true }, handler: 'OutcomesController.leased', key }));
    // The global timeout may answer first: the handler is still listened to.
    expect([201, 408]).toContain((await answer).status);
    await until(() => typesOf('leased', key).includes('lease_takeover'));
    gate.release();
    await sleep(150);
    const types = typesOf('leased', key).filter((t) => t !== 'renewed');
    expect(types).toEqual(['acquired', 'lease_lost', 'lease_takeover']);
  });

  it('Prometheus totals equal IdempotencyCounters and the events', async () => {
    await sleep(100);
    const counters = edge.app.get(IdempotencyCounters);
    const metric = async (name: string, label: string, value: string) => {
      const { values } = await registry.getSingleMetric(`idempotency_${name}_total`)!.get();
      return values.filter((s) => s.labels[label] === value).reduce((sum, s) => sum + s.value, 0);
    };
    const count = (pick: (e: IdempotencyEvent) => boolean) => seen.filter(pick).length;
    const rows: [string, IdempotencyOutcome, (e: IdempotencyEvent) => boolean][] = [
      ['acquired', 'acquired', (e) => e.type === 'acquired'],
      ['replayed', 'replayed', (e) => e.type === 'replayed'],
      ['in_progress', 'inProgress', (e) => e.type === 'in_progress' && !e.waiting],
      ['waited', 'waited', (e) => e.type === 'in_progress' && e.waiting],
      ['key_reused', 'mismatched', (e) => e.type === 'key_reused'],
      ['released', 'released', (e) => e.type === 'released'],
      ['lease_takeover', 'lateCompletions', (e) => e.type === 'lease_takeover'],
      ['store_error', 'storeErrors', (e) => e.type === 'store_error'],
      ['fail_open', 'failOpen', (e) => e.type === 'fail_open'],
    ];
    for (const [label, outcome, pick] of rows) {
      expect([label, await metric('requests', 'outcome', label), count(pick)]).toEqual([label, counters[outcome], counters[outcome]]);
    }
    const { values } = await registry.getSingleMetric('idempotency_store_duration_seconds')!.get();
    const observed = values.filter((s) => (s as { metricName?: string }).metricName?.endsWith('_count')).reduce((sum, s) => sum + s.value, 0);
    expect(observed).toBeGreaterThan(0);
    expect(observed).toBe(count((e) => e.type === 'store_call'));
  });
});

@Controller('down')
class DownController {
  runs = 0;

  @Post('open')
  @NoRepeatSubmit()
  open() {
    this.runs++;
    return { ok: true };
  }

  @Post('closed')
  @NoRepeatSubmit({ failMode: 'closed' })
  closed() {
    this.runs++;
    return { ok: true };
  }
}

describe.each<Adapter>(['express', 'fastify'])('events with the store down (%s, nothing on the Redis port)', (adapter) => {
  let edge: EdgeApp;
  const seen: IdempotencyEvent[] = [];
  const registry = new Registry();

  beforeAll(async () => {
    edge = await makeApp(
      adapter,
      [DownController],
      { store: { redis: `redis://127.0.0.1:${await freePort()}` }, keyPrefix: `rv-down-${adapter}`, leaseSeconds: 0.3, metrics: { registry }, onEvent: (e) => void seen.push(e) },
      { setup: (app) => app.useLogger(false) },
    );
  });
  afterAll(async () => edge?.close());

  it('fail-open: store_error (claim) then fail_open, once each, and the handler runs; fail-closed: store_error alone, 503', async () => {
    const open = await raw(edge.url, '/down/open', { key: randomUUID() }).answer;
    expect(open.status).toBe(201);
    const closed = await raw(edge.url, '/down/closed', { key: randomUUID() }).answer;
    expect(closed.status).toBe(503);
    // Wait out the background save retries (until the 300 ms lease ends).
    await sleep(500);
    const byHandler = (h: string) => seen.filter((e) => e.handler === `DownController.${h}` && e.type !== 'store_call');
    const openTypes = byHandler('open').map((e) => (e.type === 'store_error' ? `store_error:${e.operation}` : e.type));
    expect(openTypes.slice(0, 2)).toEqual(['store_error:claim', 'fail_open']);
    expect(openTypes.slice(2).every((t) => t === 'store_error:complete')).toBe(true);
    expect(byHandler('closed').map((e) => (e.type === 'store_error' ? `store_error:${e.operation}` : e.type))).toEqual(['store_error:claim']);

    const counters = edge.app.get(IdempotencyCounters);
    const metric = async (value: string) => {
      const { values } = await registry.getSingleMetric('idempotency_requests_total')!.get();
      return values.filter((s) => s.labels.outcome === value).reduce((sum, s) => sum + s.value, 0);
    };
    expect([await metric('store_error'), seen.filter((e) => e.type === 'store_error').length]).toEqual([counters.storeErrors, counters.storeErrors]);
    expect([await metric('fail_open'), seen.filter((e) => e.type === 'fail_open').length]).toEqual([1, 1]);
    expect(counters.failOpen).toBe(1);
  });
});
