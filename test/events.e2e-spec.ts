// The guard's events (IdempotencyEvents, the `onEvent` option): one event per decision or
// effect, exactly once each, with the route, the user segment, the key's hash and timings. A
// real Nest app on Express and real Redis, real parallel requests; a store that is down; a
// lease lost under a running handler. A listener that throws changes no answer, and the
// Prometheus metrics, a listener too, count what IdempotencyCounters counts.
import { afterAll, afterEach, beforeAll, describe, expect, it, jest } from '@jest/globals';
import {
  BadRequestException,
  Body,
  Controller,
  Injectable,
  Logger,
  Post,
  type OnModuleDestroy,
  type OnModuleInit,
} from '@nestjs/common';
import type { Redis } from 'ioredis';
import { createHash, randomUUID } from 'node:crypto';
import { Registry } from 'prom-client';
import {
  IdempotencyCounters,
  IdempotencyEvents,
  LeaseSignal,
  NoRepeatSubmit,
  RedisIdempotencyStore,
  buildStorageKey,
  type IdempotencyEvent,
  type IdempotencyEventType,
  type IdempotencyOutcome,
  type KeyUser,
} from '../libs/idempotency/src/index.js';
import { codeOf, makeApp, raw, replayed, until, type EdgeApp } from './support/edge-app.js';
import { freePort } from './support/redis-server.js';
import { connectRedis } from './support/services.js';

const PREFIX = `events-${randomUUID().slice(0, 8)}`;
const HANDLER_MS = 60;

/** Holds runs until the test opens it, and counts them. */
@Injectable()
class Gate {
  runs = 0;
  private opened: Promise<void> = Promise.resolve();
  private open: () => void = () => undefined;

  hold(): void {
    this.opened = new Promise((resolve) => (this.open = resolve));
  }

  release(): void {
    this.open();
    this.opened = Promise.resolve();
  }

  async pass(signal?: AbortSignal): Promise<void> {
    this.runs++;
    const aborted = new Promise<void>((resolve) => signal?.addEventListener('abort', () => resolve()));
    await Promise.race([this.opened, aborted]);
  }
}

@Controller('events')
class EventsController {
  constructor(private readonly gate: Gate) {}

  @Post('orders')
  @NoRepeatSubmit()
  async create(@Body() body: unknown) {
    await this.gate.pass();
    await new Promise((resolve) => setTimeout(resolve, HANDLER_MS));
    return { created: body };
  }

  @Post('waiting')
  @NoRepeatSubmit({ waitForResultMs: 10_000 })
  async waiting(@Body() body: unknown) {
    await this.gate.pass();
    return { created: body };
  }

  @Post('failing')
  @NoRepeatSubmit()
  failing(): never {
    throw new BadRequestException({ statusCode: 400, message: 'no', code: 'PLANNED' });
  }

  /**
   * Renewed every second; answers once the test opens the gate or the claim is lost. A lease of
   * seconds: a loaded machine's stall ended a 0.3 s one before its first renewal.
   */
  @Post('leased')
  @NoRepeatSubmit({ leaseSeconds: 3 })
  async leased(@LeaseSignal() signal: AbortSignal) {
    await this.gate.pass(signal);
    return { aborted: signal.aborted };
  }

  @Post('closed')
  @NoRepeatSubmit({ failMode: 'closed' })
  closed() {
    return { ok: true };
  }
}

/** A provider of the app that subscribes the way users do. */
@Injectable()
class EventLog implements OnModuleInit, OnModuleDestroy {
  readonly seen: IdempotencyEvent[] = [];
  private unsubscribe?: () => void;

  constructor(private readonly events: IdempotencyEvents) {}

  onModuleInit(): void {
    this.unsubscribe = this.events.subscribe((event) => void this.seen.push(event));
  }

  onModuleDestroy(): void {
    this.unsubscribe?.();
  }
}

const getUser = (ctx: { switchToHttp(): { getRequest<T>(): T } }) =>
  ctx.switchToHttp().getRequest<{ headers: Record<string, string | undefined> }>().headers['x-user'];

const keyHashOf = (handler: string, key: string, user: KeyUser = { anonymous: true }, prefix = PREFIX) =>
  createHash('sha256').update(buildStorageKey({ prefix, user, handler, key })).digest('hex');

describe('the guard\'s events (Express, Redis)', () => {
  let edge: EdgeApp;
  let redis: Redis;
  let gate: Gate;
  let log: EventLog;
  const fromOption: IdempotencyEvent[] = [];
  const registry = new Registry();

  beforeAll(async () => {
    redis = await connectRedis();
    edge = await makeApp(
      'express',
      [EventsController],
      {
        store: new RedisIdempotencyStore(redis),
        keyPrefix: PREFIX,
        getUser,
        metrics: { registry },
        onEvent: (event) => void fromOption.push(event),
      },
      // The lost lease below is logged as an error on purpose.
      { providers: [Gate, EventLog], setup: (app) => app.useLogger(false) },
    );
    gate = edge.app.get(Gate);
    log = edge.app.get(EventLog);
  });
  afterAll(async () => {
    await edge?.close();
    redis?.disconnect();
  });
  afterEach(() => gate.release());

  /** The events of one key, store calls aside. */
  const eventsOf = (handler: string, key: string, user?: KeyUser) =>
    log.seen.filter((event) => event.keyHash === keyHashOf(`EventsController.${handler}`, key, user) && event.type !== 'store_call');
  const typesOf = (handler: string, key: string, user?: KeyUser) => eventsOf(handler, key, user).map((event) => event.type);
  const countOf = (types: IdempotencyEventType[]) =>
    types.reduce<Record<string, number>>((counts, type) => ({ ...counts, [type]: (counts[type] ?? 0) + 1 }), {});

  it('reports a first request as acquired then completed, with the route, the user, the key hash and timings', async () => {
    const key = randomUUID();
    const answer = await raw(edge.url, '/events/orders', { key, body: { n: 1 }, headers: { 'x-user': 'user 7' } }).answer;
    expect(answer.status).toBe(201);

    const user = { id: 'user 7' };
    const events = eventsOf('create', key, user);
    expect(events.map((event) => event.type)).toEqual(['acquired', 'completed']);
    const [acquired, completed] = events;
    const route = { handler: 'EventsController.create', transport: 'http', user: 'user%207', keyHash: keyHashOf('EventsController.create', key, user) };
    expect(acquired).toMatchObject({ type: 'acquired', ...route });
    expect(completed).toMatchObject({ type: 'completed', ...route, statusCode: 201 });
    if (completed.type !== 'completed') throw new Error('unreachable');
    expect(completed.unreplayable).toBeUndefined();
    expect(completed.handlerMs).toBeGreaterThanOrEqual(HANDLER_MS - 5);
    expect(acquired.elapsedMs).toBeGreaterThanOrEqual(0);
    expect(completed.elapsedMs).toBeGreaterThanOrEqual(acquired.elapsedMs + completed.handlerMs - 1);
    // The client key itself is in no event.
    expect(JSON.stringify(events)).not.toContain(key);

    // The store calls, timed: one claim, one save.
    const calls = log.seen.filter((event) => event.keyHash === route.keyHash && event.type === 'store_call');
    expect(calls.map((event) => event.type === 'store_call' && event.operation)).toEqual(['claim', 'complete']);
    for (const call of calls) expect(call.type === 'store_call' && call.durationMs).toBeGreaterThan(0);
  });

  it('reports a duplicate after completion as replayed, once', async () => {
    const key = randomUUID();
    await raw(edge.url, '/events/orders', { key, body: { n: 1 } }).answer;
    const again = await raw(edge.url, '/events/orders', { key, body: { n: 1 } }).answer;
    expect(replayed(again)).toBe(true);
    expect(typesOf('create', key)).toEqual(['acquired', 'completed', 'replayed']);
    expect(eventsOf('create', key)[2]).toMatchObject({ type: 'replayed', statusCode: 201, user: 'anon:' });
  });

  it('reports each of 5 parallel duplicates of a running request as in_progress (409), once each', async () => {
    const key = randomUUID();
    gate.hold();
    const runsBefore = gate.runs;
    const first = raw(edge.url, '/events/orders', { key, body: { n: 1 } }).answer;
    await until(() => gate.runs === runsBefore + 1);

    const duplicates = await Promise.all(Array.from({ length: 5 }, () => raw(edge.url, '/events/orders', { key, body: { n: 1 } }).answer));
    expect(duplicates.map(codeOf)).toEqual(Array(5).fill('IDEMPOTENCY_IN_PROGRESS'));
    gate.release();
    expect((await first).status).toBe(201);

    expect(countOf(typesOf('create', key))).toEqual({ acquired: 1, in_progress: 5, completed: 1 });
    const waits = eventsOf('create', key).filter((event) => event.type === 'in_progress');
    for (const event of waits) expect(event).toMatchObject({ waiting: false, retryAfterMs: expect.any(Number) });
    expect(gate.runs).toBe(runsBefore + 1);
  });

  it('reports duplicates that wait for the first result as in_progress (waiting), then replayed', async () => {
    const key = randomUUID();
    gate.hold();
    const first = raw(edge.url, '/events/waiting', { key, body: { n: 1 } }).answer;
    await until(() => typesOf('waiting', key).includes('acquired'));
    const duplicates = Array.from({ length: 3 }, () => raw(edge.url, '/events/waiting', { key, body: { n: 1 } }).answer);
    await until(() => typesOf('waiting', key).filter((type) => type === 'in_progress').length === 3);
    gate.release();
    expect((await first).status).toBe(201);
    expect((await Promise.all(duplicates)).map(replayed)).toEqual([true, true, true]);

    expect(countOf(typesOf('waiting', key))).toEqual({ acquired: 1, in_progress: 3, completed: 1, replayed: 3 });
    const waits = eventsOf('waiting', key).filter((event) => event.type === 'in_progress');
    for (const event of waits) expect(event).toMatchObject({ waiting: true });
  });

  it('reports a key reused with another payload as key_reused, once', async () => {
    const key = randomUUID();
    await raw(edge.url, '/events/orders', { key, body: { n: 1 } }).answer;
    const other = await raw(edge.url, '/events/orders', { key, body: { n: 2 } }).answer;
    expect(other.status).toBe(422);
    expect(typesOf('create', key)).toEqual(['acquired', 'completed', 'key_reused']);
  });

  it('reports a handler that throws as released, once, and a retry acquires again', async () => {
    const key = randomUUID();
    const answer = await raw(edge.url, '/events/failing', { key }).answer;
    expect(codeOf(answer)).toBe('PLANNED');
    expect(typesOf('failing', key)).toEqual(['acquired', 'released']);
    const released = eventsOf('failing', key)[1];
    expect(released).toMatchObject({ type: 'released', handlerMs: expect.any(Number) });

    await raw(edge.url, '/events/failing', { key }).answer;
    expect(typesOf('failing', key)).toEqual(['acquired', 'released', 'acquired', 'released']);
  });

  it('reports renewals, then a lease lost under the running handler, then its refused completion', async () => {
    const key = randomUUID();
    gate.hold();
    const answer = raw(edge.url, '/events/leased', { key }).answer;
    await until(() => typesOf('leased', key).includes('renewed'));
    // Deleted behind the guard's back (an operator, an eviction): the next renewal is refused.
    await redis.del(buildStorageKey({ prefix: PREFIX, user: { anonymous: true }, handler: 'EventsController.leased', key }));

    expect(JSON.parse((await answer).text)).toEqual({ aborted: true });
    await until(() => typesOf('leased', key).includes('lease_takeover'));
    const types = typesOf('leased', key);
    const { renewed, ...once } = countOf(types);
    expect(renewed).toBeGreaterThanOrEqual(1);
    expect(once).toEqual({ acquired: 1, lease_lost: 1, lease_takeover: 1 });
    expect(types.indexOf('lease_lost')).toBeGreaterThan(types.lastIndexOf('renewed'));
    expect(eventsOf('leased', key).find((event) => event.type === 'lease_lost')).toMatchObject({
      reason: expect.stringMatching(/refused the renewal/),
    });
  });

  it('answers as usual when listeners throw or reject, and logs each failure once per listener and event type', async () => {
    const error = jest.spyOn(Logger.prototype, 'error').mockImplementation(() => undefined);
    const events = edge.app.get(IdempotencyEvents);
    const throwing = function throwingListener(): void {
      throw new Error('listener bug');
    };
    const rejecting = async function rejectingListener(): Promise<void> {
      throw new Error('async listener bug');
    };
    const unsubscribe = [events.subscribe(throwing), events.subscribe(rejecting)];
    try {
      const keys = [randomUUID(), randomUUID()];
      const firsts = await Promise.all(keys.map((key) => raw(edge.url, '/events/orders', { key, body: { n: 1 } }).answer));
      expect(firsts.map((answer) => answer.status)).toEqual([201, 201]);
      expect(firsts.map((answer) => JSON.parse(answer.text))).toEqual([{ created: { n: 1 } }, { created: { n: 1 } }]);
      const again = await raw(edge.url, '/events/orders', { key: keys[0], body: { n: 1 } }).answer;
      expect(replayed(again)).toBe(true);
      expect(JSON.parse(again.text)).toEqual({ created: { n: 1 } });
      // The other listeners still got every event.
      expect(typesOf('create', keys[0])).toEqual(['acquired', 'completed', 'replayed']);

      const types = ['acquired', 'store_call', 'completed', 'replayed'];
      await until(() => error.mock.calls.filter(([message]) => String(message).includes('(rejectingListener)')).length === types.length);
      for (const name of ['throwingListener', 'rejectingListener']) {
        const logged = error.mock.calls.map(([message]) => String(message)).filter((message) => message.includes(`(${name})`));
        expect(logged.map((message) => /failed on "(\w+)"/.exec(message)?.[1]).sort()).toEqual([...types].sort());
      }
    } finally {
      unsubscribe.forEach((stop) => stop());
      error.mockRestore();
    }
  });

  it('gives the onEvent option and a subscribed provider the same events', () => {
    expect(log.seen.length).toBeGreaterThan(20);
    expect(fromOption).toEqual(log.seen);
  });

  it('counts in Prometheus, a listener of the events, what IdempotencyCounters counts', async () => {
    const counters = edge.app.get(IdempotencyCounters);
    const metric = async (name: string, label: string, value: string) => {
      const { values } = await registry.getSingleMetric(`idempotency_${name}_total`)!.get();
      return values.filter((sample) => sample.labels[label] === value).reduce((sum, sample) => sum + sample.value, 0);
    };
    const requests: Record<string, IdempotencyOutcome> = {
      acquired: 'acquired',
      replayed: 'replayed',
      in_progress: 'inProgress',
      waited: 'waited',
      key_reused: 'mismatched',
      released: 'released',
      lease_takeover: 'lateCompletions',
      store_error: 'storeErrors',
      fail_open: 'failOpen',
      shutting_down: 'shuttingDown',
    };
    for (const [label, total] of Object.entries(requests)) {
      expect([label, await metric('requests', 'outcome', label)]).toEqual([label, counters[total]]);
    }
    expect(await metric('leases', 'event', 'renewed')).toBe(counters.renewed);
    expect(await metric('leases', 'event', 'lost')).toBe(counters.leasesLost);
    expect(counters.acquired).toBeGreaterThan(0);
    const text = await registry.metrics();
    expect(text).toMatch(/idempotency_requests_total\{handler="EventsController.create",outcome="in_progress"\} 5/);
    expect(text).toMatch(/idempotency_requests_total\{handler="EventsController.waiting",outcome="waited"\} 3/);
    expect(text).toMatch(/idempotency_store_duration_seconds_count\{operation="claim"\} [1-9]/);
  });
});

describe('the guard\'s events when the store is down (Express, nothing listening on the Redis port)', () => {
  let edge: EdgeApp;
  const seen: IdempotencyEvent[] = [];
  let prefix: string;

  beforeAll(async () => {
    prefix = `${PREFIX}-down`;
    edge = await makeApp(
      'express',
      [EventsController],
      { store: { redis: `redis://127.0.0.1:${await freePort()}` }, keyPrefix: prefix, leaseSeconds: 0.3, onEvent: (event) => void seen.push(event) },
      { providers: [Gate], setup: (app) => app.useLogger(false) },
    );
  });
  afterAll(async () => edge?.close());

  const eventsOf = (handler: string, key: string) =>
    seen.filter((event) => event.keyHash === keyHashOf(`EventsController.${handler}`, key, undefined, prefix) && event.type !== 'store_call');

  it('reports a failed claim as store_error then fail_open (the handler runs unguarded), once each', async () => {
    const key = randomUUID();
    const answer = await raw(edge.url, '/events/orders', { key, body: { n: 1 } }).answer;
    expect(answer.status).toBe(201);

    // Its save fails too (tried again until the lease ends): store errors of the `complete` operation.
    await until(() => eventsOf('create', key).some((event) => event.type === 'store_error' && event.operation === 'complete'));
    const events = eventsOf('create', key);
    const claimFailures = events.filter((event) => event.type === 'store_error' && event.operation === 'claim');
    expect(claimFailures).toHaveLength(1);
    expect(claimFailures[0]).toMatchObject({ error: expect.any(Error) });
    expect(events.filter((event) => event.type === 'fail_open')).toHaveLength(1);
    expect(events.map((event) => event.type).slice(0, 2)).toEqual(['store_error', 'fail_open']);
    expect(events.map((event) => event.type).filter((type) => type !== 'store_error' && type !== 'fail_open')).toEqual([]);
  });

  it('reports a failed claim on a fail-closed route as store_error alone (503)', async () => {
    const key = randomUUID();
    const answer = await raw(edge.url, '/events/closed', { key }).answer;
    expect(answer.status).toBe(503);
    expect(eventsOf('closed', key).map((event) => event.type === 'store_error' && event.operation)).toEqual(['claim']);
  });
});

describe('the guard\'s events with nobody listening', () => {
  let edge: EdgeApp;
  let redis: Redis;

  beforeAll(async () => {
    redis = await connectRedis();
    edge = await makeApp('express', [EventsController], { store: new RedisIdempotencyStore(redis), keyPrefix: `${PREFIX}-quiet` }, {
      providers: [Gate],
    });
  });
  afterAll(async () => {
    await edge?.close();
    redis?.disconnect();
  });

  it('builds no event, and reports to a listener that subscribes later from its next call on', async () => {
    const events = edge.app.get(IdempotencyEvents);
    expect(events.listening).toBe(false);
    const emit = jest.spyOn(events, 'emit');
    try {
      const key = randomUUID();
      await raw(edge.url, '/events/orders', { key, body: { n: 1 } }).answer;
      expect(replayed(await raw(edge.url, '/events/orders', { key, body: { n: 1 } }).answer)).toBe(true);
      expect(emit).not.toHaveBeenCalled();

      const seen: IdempotencyEvent[] = [];
      const unsubscribe = events.subscribe((event) => void seen.push(event));
      await raw(edge.url, '/events/orders', { key, body: { n: 1 } }).answer;
      unsubscribe();
      await raw(edge.url, '/events/orders', { key, body: { n: 1 } }).answer;
      expect(seen.map((event) => event.type)).toEqual(['store_call', 'replayed']);
      expect(events.listening).toBe(false);
    } finally {
      emit.mockRestore();
    }
  });
});
