import { describe, expect, it, jest } from '@jest/globals';
import { Logger } from '@nestjs/common';
import { buildStorageKey, type KeyUser } from '../keys/storage-key.js';
import { CallEvents, userSegmentOf } from './call-events.js';
import type { IdempotencyEvent } from './idempotency-event.js';
import { IdempotencyEvents } from './idempotency-events.js';

const event = (type: 'acquired' | 'renewed'): IdempotencyEvent => ({
  type,
  handler: 'OrdersController.create',
  transport: 'http',
  user: '42',
  keyHash: 'ab',
  elapsedMs: 1,
});

describe('IdempotencyEvents', () => {
  it('listens only while someone is subscribed; unsubscribing twice removes one subscription', () => {
    const events = new IdempotencyEvents();
    const seen: string[] = [];
    const listener = (e: IdempotencyEvent) => void seen.push(e.type);
    expect(events.listening).toBe(false);
    const first = events.subscribe(listener);
    const second = events.subscribe(listener);
    events.emit(event('acquired'));
    expect(seen).toEqual(['acquired', 'acquired']);
    first();
    first();
    expect(events.listening).toBe(true);
    events.emit(event('renewed'));
    expect(seen).toEqual(['acquired', 'acquired', 'renewed']);
    second();
    expect(events.listening).toBe(false);
  });

  it('finishes an emit with the listeners it began with, when one unsubscribes another', () => {
    const events = new IdempotencyEvents();
    const seen: string[] = [];
    let stopB = () => undefined as void;
    events.subscribe(() => {
      seen.push('a');
      stopB();
    });
    stopB = events.subscribe(() => void seen.push('b'));
    events.emit(event('acquired'));
    events.emit(event('acquired'));
    expect(seen).toEqual(['a', 'b', 'a']);
  });

  it('logs what a listener throws or rejects once per listener and event type, and goes on', async () => {
    const error = jest.spyOn(Logger.prototype, 'error').mockImplementation(() => undefined);
    try {
      const events = new IdempotencyEvents();
      const seen: string[] = [];
      events.subscribe(function broken() {
        throw 'not an Error';
      });
      events.subscribe(async function rejects() {
        throw new Error('later');
      });
      events.subscribe((e) => void seen.push(e.type));
      for (const type of ['acquired', 'acquired', 'renewed', 'renewed'] as const) events.emit(event(type));
      await new Promise((resolve) => setImmediate(resolve));
      expect(seen).toEqual(['acquired', 'acquired', 'renewed', 'renewed']);
      const messages = error.mock.calls.map(([message]) => String(message));
      expect(messages).toHaveLength(4);
      expect(messages.filter((m) => m.includes('(broken) failed on "acquired"') && m.includes('not an Error'))).toHaveLength(1);
      expect(messages.filter((m) => m.includes('(broken) failed on "renewed"'))).toHaveLength(1);
      expect(messages.filter((m) => m.includes('(rejects) failed on "acquired"') && m.includes('later'))).toHaveLength(1);
      expect(messages.filter((m) => m.includes('(rejects) failed on "renewed"'))).toHaveLength(1);
    } finally {
      error.mockRestore();
    }
  });
});

describe('CallEvents', () => {
  it.each<[string, KeyUser, string]>([
    ['a user id', { id: '42' }, '42'],
    ['a user id with ":" and spaces', { id: 'ip:1 2' }, 'ip%3A1%202'],
    ['an address', { ip: '::1' }, 'ip:%3A%3A1'],
    ['the anonymous namespace', { anonymous: true }, 'anon:'],
    ['a message (no user)', { id: '' }, ''],
  ])('reads the user segment of %s from the storage key', (_, user, segment) => {
    expect(userSegmentOf(buildStorageKey({ prefix: 'p', user, handler: 'A.b', key: 'k:1:2' }))).toBe(segment);
  });

  it('reports a call to the subscriptions it began with only, skipping those undone since', () => {
    const events = new IdempotencyEvents();
    const seen: string[] = [];
    const stopA = events.subscribe((e) => void seen.push(`a:${e.type}`));
    events.subscribe((e) => void seen.push(`b:${e.type}`));
    const call = new CallEvents(events, 'A.b', 'http', 'p:anon::A.b:k', 0);
    events.subscribe((e) => void seen.push(`late:${e.type}`));
    call.emit('acquired', {});
    stopA();
    call.emit('renewed', {});
    expect(seen).toEqual(['a:acquired', 'b:acquired', 'b:renewed']);
  });

  it('times handlerMs up to the answer ready (settled), not to the event', async () => {
    const events = new IdempotencyEvents();
    const seen: IdempotencyEvent[] = [];
    events.subscribe((e) => void seen.push(e));
    const call = new CallEvents(events, 'A.b', 'http', 'p:anon::A.b:k', 0);
    call.held();
    call.settled();
    await new Promise((resolve) => setTimeout(resolve, 30));
    call.emit('completed', { statusCode: 201, unreplayable: undefined });
    const completed = seen[0] as Extract<IdempotencyEvent, { type: 'completed' }>;
    expect(completed.handlerMs).toBeLessThan(20);
  });

  it('builds nothing once nobody listens, and times handlerMs from the held claim', () => {
    const events = new IdempotencyEvents();
    const seen: IdempotencyEvent[] = [];
    const stop = events.subscribe((e) => void seen.push(e));
    const call = new CallEvents(events, 'A.b', 'rpc', 'p::A.b:k', 0);
    call.held();
    call.emit('completed', { statusCode: 0, unreplayable: undefined });
    expect(seen).toHaveLength(1);
    expect(seen[0]).toMatchObject({ type: 'completed', handler: 'A.b', transport: 'rpc', user: '', statusCode: 0 });
    const completed = seen[0] as Extract<IdempotencyEvent, { type: 'completed' }>;
    expect(completed.handlerMs).toBeLessThan(completed.elapsedMs);
    expect(completed.keyHash).toMatch(/^[0-9a-f]{64}$/);
    stop();
    call.emit('renewed', {});
    expect(seen).toHaveLength(1);
  });
});
