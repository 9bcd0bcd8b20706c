import { describe, expect, it } from '@jest/globals';
import { Logger } from '@nestjs/common';
import { IdempotencyCounters } from '../metrics/idempotency-counters.js';
import { MemoryIdempotencyStore } from '../stores/memory/memory-idempotency.store.js';
import type { SavedResponse } from '../stores/idempotency-store.js';
import { LATE_SAVES_MAX_BYTES, LATE_SAVES_MAX_ENTRIES, LateSaves, type LateSave } from './late-saves.js';
import { OutageLog } from './outage-log.js';
import type { GuardedRoute } from './route-options.js';

const sleep = (ms: number) => new Promise<void>((resolve) => setTimeout(resolve, ms));

/**
 * A real memory store behind a switch: while `down`, every call fails as a store outage does.
 * (The memory store cannot be down; the Redis outage itself is in guard-edge-fail-open-lease.)
 */
class SwitchedStore extends MemoryIdempotencyStore {
  down = true;
  pings = 0;
  completes = 0;

  override async ping(): Promise<void> {
    this.pings++;
    if (this.down) throw new Error('store down');
    return super.ping();
  }

  override async complete(key: string, token: string, response: SavedResponse, retentionMs: number): Promise<boolean> {
    this.completes++;
    if (this.down) throw new Error('store down');
    return super.complete(key, token, response, retentionMs);
  }
}

const route = { handler: 'OrdersController.create', expireMs: 60_000, leaseMs: 10_000 } as GuardedRoute;
const lateSaves = (store: MemoryIdempotencyStore) => new LateSaves(store, new IdempotencyCounters(), new OutageLog(new Logger('test')), new Logger('test'));
const response: SavedResponse = { statusCode: 201, headers: { 'content-type': 'application/json' }, body: '{"id":1}' };
const lateSave = (key: string, untilMs = 10_000, body = response.body): LateSave => ({
  storageKey: key,
  token: `token-${key}`,
  response: { ...response, body },
  route,
  until: performance.now() + untilMs,
  uncertain: true,
  events: undefined,
});

describe('LateSaves', () => {
  it('probes a down store with one call at a time for all its saves, then saves each after the claim that landed meanwhile', async () => {
    const store = new SwitchedStore();
    const saves = lateSaves(store);
    for (let i = 0; i < 50; i++) expect(saves.add(lateSave(`k${i}`))).toBe(true);
    await sleep(700); // probes at ~100, 300, 700 ms
    expect({ pings: store.pings, completes: store.completes }).toEqual({ pings: expect.any(Number), completes: 0 });
    expect(store.pings).toBeLessThanOrEqual(4);
    // The claims the client kept land as the store comes back, before what it queued after them.
    for (let i = 0; i < 50; i++) await store.claim({ key: `k${i}`, token: `token-k${i}`, fingerprint: '', leaseMs: 10_000 });
    store.down = false;
    for (let waited = 0; saves.size > 0 && waited < 3000; waited += 50) await sleep(50);
    const records = await Promise.all(Array.from({ length: 50 }, (_, i) => store.get(`k${i}`)));
    expect(records.map((record) => record?.state)).toEqual(Array(50).fill('completed'));
    expect(store.completes).toBe(50);
  });

  it('at shutdown (flush), saves what it keeps at once when the store answers, and gives up the rest within 2 s when it hangs', async () => {
    const store = new SwitchedStore();
    const saves = lateSaves(store);
    await store.claim({ key: 'back', token: 'token-back', fingerprint: '', leaseMs: 10_000 });
    saves.add(lateSave('back'));
    store.down = false;
    await saves.flush();
    expect({ waiting: saves.size, state: (await store.get('back'))?.state }).toEqual({ waiting: 0, state: 'completed' });
    const hung = new SwitchedStore();
    hung.ping = () => new Promise<void>(() => undefined);
    const kept = lateSaves(hung);
    kept.add(lateSave('never'));
    const startedAt = performance.now();
    await kept.flush();
    expect(performance.now() - startedAt).toBeLessThan(3000);
    expect({ waiting: kept.size, completes: hung.completes }).toEqual({ waiting: 0, completes: 0 });
  });

  it('gives a save up at its time, never having sent it to a store that stayed down', async () => {
    const store = new SwitchedStore();
    const saves = lateSaves(store);
    saves.add(lateSave('short', 250));
    await sleep(800);
    expect({ waiting: saves.size, completes: store.completes }).toEqual({ waiting: 0, completes: 0 });
  });

  it('keeps at most its entries and bytes: a save past either is refused (given up)', () => {
    const saves = lateSaves(new SwitchedStore());
    expect(saves.add(lateSave('huge', 10_000, 'x'.repeat(LATE_SAVES_MAX_BYTES + 1)))).toBe(false);
    for (let i = 0; i < LATE_SAVES_MAX_ENTRIES; i++) saves.add(lateSave(`k${i}`, 500));
    expect(saves.add(lateSave('one-more', 500))).toBe(false);
    expect(saves.size).toBe(LATE_SAVES_MAX_ENTRIES);
  });

  // A probe that threw (a store whose ping throws at the call) left its timer set and no next
  // probe: every save waited for ever, and an unhandled rejection could end the process.
  it('goes on probing when the store throws at the call, and saves once it answers', async () => {
    const store = new ThrowingStore();
    const saves = lateSaves(store);
    await store.claim({ key: 'k', token: 'token-k', fingerprint: '', leaseMs: 10_000 });
    saves.add(lateSave('k'));
    await sleep(400);
    store.down = false;
    for (let waited = 0; saves.size > 0 && waited < 3000; waited += 50) await sleep(50);
    expect((await store.get('k'))?.state).toBe('completed');
  });
});

/** A store whose ping throws at the call (not a rejected promise) while down. */
class ThrowingStore extends MemoryIdempotencyStore {
  down = true;

  override ping(): Promise<void> {
    if (this.down) throw new Error('store down');
    return super.ping();
  }
}
