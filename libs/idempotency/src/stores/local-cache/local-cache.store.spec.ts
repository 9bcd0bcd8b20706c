import { afterEach, beforeEach, describe, expect, it, jest } from '@jest/globals';
import { within } from '../../../../../test/support/eventually.js';
import type { SavedResponse } from '../idempotency-store.js';
import { MemoryIdempotencyStore } from '../memory/memory-idempotency.store.js';
import { LocalCacheIdempotencyStore } from './local-cache.store.js';
import type { RecordTracking, TrackedRecord, TrackingListener } from './record-tracking.js';

const answer: SavedResponse = { statusCode: 201, headers: { location: '/orders/1' }, body: '{"id":1}' };

/**
 * Tracking whose reads the test answers by hand, to order a read's reply against invalidations.
 * Each read answers what the memory store holds when the test lets it (`answer()`).
 */
class HandTracking implements RecordTracking {
  live = true;
  listener!: TrackingListener;
  reads: { key: string; answer: (ttlMs?: number) => Promise<void> }[] = [];

  constructor(private readonly store: MemoryIdempotencyStore) {}

  async start(listener: TrackingListener) {
    this.listener = listener;
  }

  read(key: string): Promise<TrackedRecord | undefined> {
    return new Promise((resolve) => {
      this.reads.push({
        key,
        answer: async (ttlMs) => {
          const record = await this.store.get(key);
          const found = record?.state === 'completed' ? record : undefined;
          resolve(found && { fingerprint: found.fingerprint, response: found.response!, ttlMs: ttlMs ?? found.ttlMs });
          await Promise.resolve();
        },
      });
    });
  }

  async heardEverywhere() {}

  async stop() {
    this.live = false;
  }
}

describe('LocalCacheIdempotencyStore', () => {
  let inner: MemoryIdempotencyStore;
  let tracking: HandTracking;
  let store: LocalCacheIdempotencyStore;
  let innerClaims: jest.SpiedFunction<MemoryIdempotencyStore['claim']>;
  const claim = (token: string, fingerprint = 'fp') => store.claim({ key: 'k', token, fingerprint, leaseMs: 10_000 });

  /** Claims and completes `k` through the cache. */
  async function completeHere(retentionMs = 60_000) {
    expect(await claim('t1')).toEqual({ status: 'acquired', token: 't1' });
    expect(await store.complete('k', 't1', answer, retentionMs)).toBe(true);
  }

  /** `k` completed here, then replayed once (the store answers, and the cache reads it back). */
  async function replayedOnce() {
    await completeHere();
    expect(await claim('seen')).toEqual({ status: 'completed', response: answer });
    expect(tracking.reads).toMatchObject([{ key: 'k' }]);
    await tracking.reads[0].answer();
    innerClaims.mockClear();
  }

  beforeEach(async () => {
    // Node's ticks stay real: the order spec watches them.
    jest.useFakeTimers({ doNotFake: ['nextTick'] });
    inner = new MemoryIdempotencyStore();
    tracking = new HandTracking(inner);
    store = new LocalCacheIdempotencyStore(inner, tracking, { maxEntries: 100, maxBytes: 1 << 20 });
    await store.onModuleInit();
    innerClaims = jest.spyOn(inner, 'claim');
  });
  afterEach(async () => {
    await store.onApplicationShutdown();
    jest.useRealTimers();
  });

  it('answers a replay without the store once the store answered one and the tracked read is back', async () => {
    await replayedOnce();
    expect(await claim('t2')).toEqual({ status: 'completed', response: answer });
    expect(await claim('t3', 'other')).toEqual({ status: 'mismatch' });
    expect(await claim('t4', '')).toEqual({ status: 'completed', response: answer });
    expect(innerClaims).not.toHaveBeenCalled();
  });

  it('keeps nothing from its own completion: a first request costs what it costs without the cache', async () => {
    await completeHere();
    expect(tracking.reads).toEqual([]);
    expect(store.cacheStats().entries).toBe(0);
    // Its first replay is the store's, and fills the cache.
    expect(await claim('t2')).toEqual({ status: 'completed', response: answer });
    expect(innerClaims).toHaveBeenCalledTimes(2);
    expect(tracking.reads).toHaveLength(1);
  });

  it('answers the hits of one turn together in the check phase, in one run of the microtask queue', async () => {
    await replayedOnce();
    // Ten replays arriving in one turn (one poll of the sockets). Each waiting for a check phase
    // of its own (a setImmediate each) was answered in a run of the microtask queue of its own,
    // Node's ticks between them (~9 µs of CPU a cached replay on Fastify, bench/README.md): a
    // tick queued by the first answer then ran before the second answer.
    const order: string[] = [];
    const answers = await Promise.all(
      Array.from({ length: 10 }, (_, i) =>
        claim(`r${i}`).then((result) => {
          order.push('answer');
          process.nextTick(() => order.push('tick'));
          return result;
        }),
      ),
    );
    expect(answers).toEqual(Array(10).fill({ status: 'completed', response: answer }));
    await new Promise((resolve) => process.nextTick(resolve));
    expect(order).toEqual([...Array(10).fill('answer'), ...Array(10).fill('tick')]);
    // The next turn's hits wait for the next check phase.
    expect(await claim('later')).toEqual({ status: 'completed', response: answer });
    expect(innerClaims).not.toHaveBeenCalled();
  });

  it('answers hits while setImmediate is a fake timer that never runs, as a round trip would be answered', async () => {
    await replayedOnce();
    // The spec's fake timers hold the global setImmediate: a hit must not wait for them.
    expect(await within(claim('faked'))).toEqual({ status: 'completed', response: answer });
  });

  it('answers later hits when fake timers dropped a check phase a hit waited for', async () => {
    await replayedOnce();
    // A test that fakes setImmediate, makes a hit, and goes back to real timers without running it.
    jest.useFakeTimers();
    void claim('left-waiting');
    jest.useRealTimers();
    expect(await within(claim('after'))).toEqual({ status: 'completed', response: answer });
  });

  it('fills from a claim that found the record completed, with the answer the read found', async () => {
    await inner.claim({ key: 'k', token: 'elsewhere', fingerprint: 'fp', leaseMs: 10_000 });
    await inner.complete('k', 'elsewhere', answer, 60_000);
    expect(await claim('t2')).toEqual({ status: 'completed', response: answer });
    expect(tracking.reads).toMatchObject([{ key: 'k' }]);
    expect(await claim('t3')).toMatchObject({ status: 'completed' }); // a read on its way: asked again, not twice
    expect(tracking.reads).toHaveLength(1);
    await tracking.reads[0].answer();
    innerClaims.mockClear();
    expect(await claim('t4')).toEqual({ status: 'completed', response: answer });
    expect(innerClaims).not.toHaveBeenCalled();
  });

  it.each([
    ['another answer', { ...answer, body: '{"id":2}' }, 'fp'],
    ['the same answer claimed with another fingerprint', answer, 'other'],
  ])('keeps nothing when the read finds another record than the claim did (%s: a reader on another db)', async (_what, other, fingerprint) => {
    await completeHere();
    expect(await claim('seen')).toEqual({ status: 'completed', response: answer });
    // The store's record changes unannounced, as the record of the same key in another db would read.
    await inner.forget('k');
    await inner.claim({ key: 'k', token: 'elsewhere', fingerprint, leaseMs: 10_000 });
    await inner.complete('k', 'elsewhere', other, 60_000);
    await tracking.reads[0].answer();
    expect(store.cacheStats().entries).toBe(0);
  });

  it('discards a read whose key was invalidated before the read came back (the race with the tracking)', async () => {
    await completeHere();
    await claim('seen');
    tracking.listener.invalidated(['k']);
    await tracking.reads[0].answer();
    innerClaims.mockClear();
    await claim('t2');
    expect(innerClaims).toHaveBeenCalledTimes(1);
    expect(store.cacheStats().entries).toBe(0);
  });

  it('asks the store when the entry is invalidated while its hit waits for the check phase (a forget read in the same poll)', async () => {
    await replayedOnce();
    const hit = claim('t2');
    tracking.listener.invalidated(['k']);
    await inner.forget('k');
    expect(await hit).toEqual({ status: 'acquired', token: 't2' });
    expect(innerClaims).toHaveBeenCalledTimes(1);
  });

  it('discards every read on its way, and every entry, when tracking is reset', async () => {
    await replayedOnce();
    await inner.claim({ key: 'k2', token: 'x', fingerprint: '', leaseMs: 10_000 });
    await inner.complete('k2', 'x', answer, 60_000);
    await store.claim({ key: 'k2', token: 'y', fingerprint: '', leaseMs: 10_000 });
    expect(store.cacheStats().entries).toBe(1);
    tracking.listener.reset();
    await tracking.reads[1].answer();
    expect(store.cacheStats().entries).toBe(0);
  });

  it('reads nothing back for a record too large to keep (over maxBytes alone)', async () => {
    const small = new LocalCacheIdempotencyStore(inner, tracking, { maxEntries: 100, maxBytes: 400 });
    await inner.claim({ key: 'big', token: 'x', fingerprint: '', leaseMs: 10_000 });
    await inner.complete('big', 'x', { ...answer, body: 'x'.repeat(200) }, 60_000);
    expect(await small.claim({ key: 'big', token: 'y', fingerprint: '', leaseMs: 10_000 })).toMatchObject({ status: 'completed' });
    expect(tracking.reads).toEqual([]);
  });

  it('caches nothing while tracking is not live', async () => {
    tracking.live = false;
    await completeHere();
    await claim('t2');
    await claim('t3');
    expect(tracking.reads).toHaveLength(0);
  });

  it('forgets at once here, also a read on its way, and in the store', async () => {
    await completeHere();
    await claim('seen');
    const pending = tracking.reads[0];
    expect(await store.forget('k')).toEqual({ forgotten: true });
    await pending.answer(60_000);
    expect(await claim('t2')).toEqual({ status: 'acquired', token: 't2' });
  });

  it('never answers past the retention the read found, counted from before the read', async () => {
    await completeHere();
    await claim('seen');
    jest.advanceTimersByTime(100); // the read's round trip
    await tracking.reads[0].answer(1_000);
    jest.advanceTimersByTime(899);
    innerClaims.mockClear();
    expect(await claim('t2')).toMatchObject({ status: 'completed' });
    expect(innerClaims).not.toHaveBeenCalled();
    jest.advanceTimersByTime(1);
    await claim('t3');
    expect(innerClaims).toHaveBeenCalledTimes(1); // the entry ended 1,000 ms after the read was sent; the store still has the record
  });
});
