// "What a listener throws, or a promise it returns rejects with, is logged once per
// listener and event type; the answer never changes" (README, Events), and slow listeners.
import { afterAll, beforeAll, describe, expect, it, jest } from '@jest/globals';
import { Body, Controller, Logger, Post } from '@nestjs/common';
import { randomUUID } from 'node:crypto';
import { IdempotencyCounters, IdempotencyEvents, NoRepeatSubmit, type IdempotencyEvent } from '../libs/idempotency/src/index.js';
import { makeApp, raw, replayed, type Adapter, type EdgeApp } from './support/edge-app.js';

@Controller('faults')
class FaultsController {
  runs = 0;

  @Post()
  @NoRepeatSubmit()
  create(@Body() body: unknown) {
    this.runs++;
    return { created: body };
  }
}

describe.each<Adapter>(['express', 'fastify'])('listeners that fail (%s, memory store)', (adapter) => {
  let edge: EdgeApp;
  let events: IdempotencyEvents;

  beforeAll(async () => {
    edge = await makeApp(adapter, [FaultsController], { keyPrefix: `rv-faults-${adapter}` }, { setup: (app) => app.useLogger(false) });
    events = edge.app.get(IdempotencyEvents);
  });
  afterAll(async () => edge?.close());

  it('answers as usual when a listener throws a value with no prototype (a dictionary object)', async () => {
    const error = jest.spyOn(Logger.prototype, 'error').mockImplementation(() => undefined);
    const unsubscribe = events.subscribe(function dictionaryThrower() {
      throw Object.assign(Object.create(null) as object, { code: 'E_AUDIT' });
    });
    try {
      const key = randomUUID();
      // Before the fix: 500 — the logging of the listener's failure ("String(error)") throws a TypeError
      // out of IdempotencyEvents.emit into the guard; the handler never runs and the key stays held.
      const first = await raw(edge.url, '/faults', { key, body: { n: 1 } }).answer;
      expect(first.status).toBe(201);
      expect(JSON.parse(first.text)).toEqual({ created: { n: 1 } });
      const again = await raw(edge.url, '/faults', { key, body: { n: 1 } }).answer;
      expect(replayed(again)).toBe(true);
    } finally {
      unsubscribe();
      error.mockRestore();
    }
  });

  it('answers at once, the same, with a slow async listener and one that re-subscribes itself on every event', async () => {
    const slow: IdempotencyEvent[] = [];
    // The slow listener waits until the test lets it go (20 s at most): the answer must come while
    // it still waits (a 2 s listener and a 1 s bound on the answer raced a loaded machine).
    let letGo: () => void = () => undefined;
    const listenerGate = new Promise<void>((resolve) => {
      letGo = resolve;
      setTimeout(resolve, 20_000).unref();
    });
    const unsubscribeSlow = events.subscribe(async (event) => {
      await listenerGate;
      slow.push(event);
    });
    let stop = () => undefined as void;
    const churn = (event: IdempotencyEvent) => {
      void event;
      stop();
      stop = events.subscribe(churn);
    };
    stop = events.subscribe(churn);
    try {
      const key = randomUUID();
      const first = await raw(edge.url, '/faults', { key, body: { n: 2 } }).answer;
      expect({ status: first.status, listenerDone: slow.length }).toEqual({ status: 201, listenerDone: 0 });
      const again = await raw(edge.url, '/faults', { key, body: { n: 2 } }).answer;
      expect(replayed(again)).toBe(true);
      expect(JSON.parse(again.text)).toEqual({ created: { n: 2 } });
      const counters = edge.app.get(IdempotencyCounters);
      expect(counters.acquired).toBeGreaterThanOrEqual(1);
    } finally {
      letGo();
      unsubscribeSlow();
      stop();
    }
  });
});
