// "A call is reported whole, to the listeners there when it began" (README, Events;
// IdempotencyEvents' doc: "so a listener never sees half of a call"). A listener that subscribes
// while a call is under way must see none of that call's events.
import { afterAll, beforeAll, describe, expect, it } from '@jest/globals';
import { Body, Controller, Injectable, Post } from '@nestjs/common';
import { randomUUID } from 'node:crypto';
import { IdempotencyEvents, NoRepeatSubmit, type IdempotencyEvent } from '../libs/idempotency/src/index.js';
import { makeApp, raw, until, type Adapter, type EdgeApp } from './support/edge-app.js';

@Injectable()
class Gate {
  started = 0;
  private open!: () => void;
  private opened: Promise<void> = Promise.resolve();
  hold(): void {
    this.opened = new Promise((resolve) => (this.open = resolve));
  }
  release(): void {
    this.open?.();
    this.opened = Promise.resolve();
  }
  async pass(): Promise<void> {
    this.started++;
    await this.opened;
  }
}

@Controller('mid')
class MidController {
  constructor(private readonly gate: Gate) {}

  @Post()
  @NoRepeatSubmit()
  async create(@Body() body: unknown) {
    await this.gate.pass();
    return { created: body };
  }
}

describe.each<Adapter>(['express', 'fastify'])('a listener that subscribes mid-call (%s, memory store)', (adapter) => {
  let edge: EdgeApp;
  let gate: Gate;
  let events: IdempotencyEvents;
  const always: IdempotencyEvent[] = [];

  beforeAll(async () => {
    edge = await makeApp(adapter, [MidController], { keyPrefix: `rv-mid-${adapter}`, onEvent: (e) => void always.push(e) }, {
      providers: [Gate],
      setup: (app) => app.useLogger(false),
    });
    gate = edge.app.get(Gate);
    events = edge.app.get(IdempotencyEvents);
  });
  afterAll(async () => edge?.close());

  it('sees nothing of a call that began before it subscribed (subscribed while the handler runs)', async () => {
    const key = randomUUID();
    gate.hold();
    const first = raw(edge.url, '/mid', { key, body: { n: 1 } }).answer;
    await until(() => gate.started === 1);
    const keyHash = always.find((e) => e.type === 'acquired')!.keyHash;

    const late: IdempotencyEvent[] = [];
    const unsubscribe = events.subscribe((e) => void late.push(e));
    try {
      gate.release();
      expect((await first).status).toBe(201);
      await until(() => always.some((e) => e.keyHash === keyHash && e.type === 'completed'));
      // Correct: the late listener was not there when the call began, so it gets none of it.
      // Before the fix: ['store_call', 'completed'] — a 'completed' with no 'acquired' before it.
      expect(late.filter((e) => e.keyHash === keyHash).map((e) => e.type)).toEqual([]);
    } finally {
      unsubscribe();
    }
  });

  it('sees nothing of a call in flight when a listener subscribes another one during an emission', async () => {
    const key = randomUUID();
    const late: IdempotencyEvent[] = [];
    let unsubscribeLate: (() => void) | undefined;
    const unsubscribe = events.subscribe((e) => {
      if (e.type === 'acquired' && !unsubscribeLate) unsubscribeLate = events.subscribe((x) => void late.push(x));
    });
    try {
      expect((await raw(edge.url, '/mid', { key, body: { n: 2 } }).answer).status).toBe(201);
      const keyHash = always.filter((e) => e.type === 'acquired').at(-1)!.keyHash;
      await until(() => always.some((e) => e.keyHash === keyHash && e.type === 'completed'));
      expect(late.filter((e) => e.keyHash === keyHash).map((e) => e.type)).toEqual([]);
    } finally {
      unsubscribe();
      unsubscribeLate?.();
    }
  });
});
