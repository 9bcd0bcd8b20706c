import { afterEach, beforeEach, describe, expect, it, jest } from '@jest/globals';
import { setFlagsFromString } from 'node:v8';
import { runInNewContext } from 'node:vm';
import { IdempotencyStoreError } from '../../errors/idempotency.errors.js';
import { describeStoreContract } from '../../testing/index.js';
import { MemoryIdempotencyStore } from './memory-idempotency.store.js';

// First in the file: the store's clock is the module's, and the fake timers of the specs below
// run far ahead of real time (it never goes back, so real time is then not counted).
describe('MemoryIdempotencyStore in a test that turns fake timers on, then off', () => {
  afterEach(() => {
    jest.useRealTimers();
  });

  it('counts the real time that passes after fake timers are switched off: a record ends with its retention', async () => {
    jest.useFakeTimers();
    const store = new MemoryIdempotencyStore();
    await store.claim({ key: 'short', token: 't', fingerprint: 'fp', leaseMs: 60_000 });
    await store.complete('short', 't', { statusCode: 201, headers: {}, body: '1' }, 300);
    jest.useRealTimers();
    await new Promise((resolve) => setTimeout(resolve, 500));
    expect(await store.get('short')).toBeUndefined();
  });
});

describe('MemoryIdempotencyStore', () => {
  beforeEach(() => {
    jest.useFakeTimers();
  });
  afterEach(() => {
    jest.useRealTimers();
  });

  describeStoreContract('memory', async () => ({
    store: new MemoryIdempotencyStore(),
    elapse: async (ms) => void jest.advanceTimersByTime(ms),
  }));

  const claimIn = (store: MemoryIdempotencyStore, key: string, leaseMs = 60_000) =>
    store.claim({ key, token: `t-${key}`, fingerprint: 'fp', leaseMs });
  const held = async (store: MemoryIdempotencyStore, keys: string[]) =>
    Promise.all(keys.map(async (key) => (await store.get(key)) !== undefined));

  it('keeps time across fake timers switched off and on: a record keeps its retention, no more, no less', async () => {
    // Fake timers start their performance.now() at 0: a day on the fake clock, then real timers
    // (the process's uptime), then fake again, is a jump of a day each way unless the store's
    // clock goes on from its last reading.
    jest.advanceTimersByTime(86_400_000);
    const store = new MemoryIdempotencyStore();
    await claimIn(store, 'kept');
    await store.complete('kept', 't-kept', { statusCode: 201, headers: {}, body: '1' }, 60_000);
    const ttls: number[] = [];
    jest.useRealTimers();
    ttls.push((await store.get('kept'))?.ttlMs ?? 0);
    jest.useFakeTimers();
    ttls.push((await store.get('kept'))?.ttlMs ?? 0);
    jest.advanceTimersByTime(60_000);
    expect(await store.get('kept')).toBeUndefined();
    for (const ttl of ttls) {
      expect(ttl).toBeGreaterThan(59_000);
      expect(ttl).toBeLessThanOrEqual(60_000);
    }
  });

  it('keeps an in-flight claim through a flood of 1,000 other keys: its duplicate is in progress, the flood is refused', async () => {
    const store = new MemoryIdempotencyStore({ maxEntries: 100 });
    await claimIn(store, 'in-flight', 30_000);
    await claimIn(store, 'done');
    await store.complete('done', 't-done', { statusCode: 201, headers: {}, body: '1' }, 60_000);
    const flood = await Promise.all(
      Array.from({ length: 1000 }, (_, i) => claimIn(store, `flood-${i}`).catch((error: unknown) => error)),
    );
    // The duplicate of the in-flight request must not run its handler a second time.
    expect(await store.claim({ key: 'in-flight', token: 'dup', fingerprint: 'fp', leaseMs: 30_000 })).toMatchObject({
      status: 'in_progress',
    });
    expect(flood.slice(0, 98).every((r) => (r as { status?: string }).status === 'acquired')).toBe(true);
    const refused = flood.slice(98);
    expect(refused.every((r) => r instanceof IdempotencyStoreError)).toBe(true);
    expect((refused[0] as Error).message).toBe('memory store full: 100 live records; raise memoryMaxEntries or use Redis');
    expect(store.size).toBe(100);
    // Keys it holds still answer as usual while it is full.
    expect(await store.claim({ key: 'in-flight', token: 'dup', fingerprint: 'other', leaseMs: 30_000 })).toEqual({ status: 'mismatch' });
    expect(await store.claim({ key: 'done', token: 'dup', fingerprint: 'fp', leaseMs: 30_000 })).toMatchObject({ status: 'completed' });
    expect(await store.complete('in-flight', 't-in-flight', { statusCode: 200, headers: {} }, 60_000)).toBe(true);
    expect(await store.claim({ key: 'in-flight', token: 'dup', fingerprint: 'fp', leaseMs: 30_000 })).toMatchObject({
      status: 'completed',
    });
  });

  // helper-203: bounded by entries only, answers of ~900 KiB under unique keys grew the heap
  // 0.88 MiB a record until the process died (JavaScript heap out of memory), every record with it.
  it('keeps the bytes it holds within maxBytes: an answer past them is kept unreplayable, a key past them refused', async () => {
    const store = new MemoryIdempotencyStore({ maxBytes: 100_000 });
    const answer = (n: number) => ({ statusCode: 201, headers: { 'content-type': 'text/plain' }, body: 'x'.repeat(n) });
    await claimIn(store, 'first');
    expect(await store.complete('first', 't-first', answer(60_000), 60_000)).toBe(true);
    await claimIn(store, 'second');
    // It completes (no second run), but holds no body: its duplicates get 409 not replayable.
    expect(await store.complete('second', 't-second', answer(60_000), 60_000)).toBe(true);
    expect(await claimIn(store, 'first')).toMatchObject({ status: 'completed', response: { body: 'x'.repeat(60_000) } });
    expect(await claimIn(store, 'second')).toEqual({ status: 'completed', response: { statusCode: 201, headers: {}, unreplayable: 'too_large' } });
    expect(store.bytes).toBeLessThanOrEqual(100_000);
    // A key longer than the room left (a 40,000-character user id) is refused as a full store.
    await expect(claimIn(store, 'k'.repeat(40_000))).rejects.toThrow(/memory store full: .* bytes; raise memoryMaxBytes or use Redis/);
    // Room comes back as records go: forgotten, released, expired.
    expect(await store.forget('first')).toEqual({ forgotten: true });
    await claimIn(store, 'third');
    expect(await store.complete('third', 't-third', answer(60_000), 60_000)).toBe(true);
    expect(await claimIn(store, 'third')).toMatchObject({ status: 'completed', response: { body: 'x'.repeat(60_000) } });
    jest.advanceTimersByTime(60_001);
    await claimIn(store, 'fourth');
    expect(await store.complete('fourth', 't-fourth', answer(90_000), 60_000)).toBe(true);
    expect(await claimIn(store, 'fourth')).toMatchObject({ status: 'completed', response: { body: 'x'.repeat(90_000) } });
    expect(store.bytes).toBeLessThanOrEqual(100_000);
  });

  // helper-203/204: only the body was dropped, so a body-less answer with big headers (a 204 with
  // a 60 KB Link header, say) went past maxBytes as it was.
  it('keeps a body-less answer whose headers would pass maxBytes unreplayable, without them', async () => {
    const store = new MemoryIdempotencyStore({ maxBytes: 100_000 });
    await claimIn(store, 'first');
    expect(await store.complete('first', 't-first', { statusCode: 204, headers: { link: 'l'.repeat(60_000) } }, 60_000)).toBe(true);
    await claimIn(store, 'second');
    expect(await store.complete('second', 't-second', { statusCode: 204, headers: { link: 'l'.repeat(60_000) } }, 60_000)).toBe(true);
    expect(await claimIn(store, 'second')).toEqual({ status: 'completed', response: { statusCode: 204, headers: {}, unreplayable: 'too_large' } });
    expect(store.bytes).toBeLessThanOrEqual(100_000);
  });

  it('makes room in a full store by dropping expired entries only, however old the live ones are', async () => {
    const store = new MemoryIdempotencyStore({ maxEntries: 10 });
    const live = ['live-0', 'live-1', 'live-2', 'live-3', 'live-4', 'live-5'];
    // The live records are the oldest claims: an oldest-first bound would drop them.
    for (const key of live.slice(0, 3)) await claimIn(store, key);
    for (const key of live.slice(3)) {
      await claimIn(store, key, 100);
      await store.complete(key, `t-${key}`, { statusCode: 200, headers: {} }, 60_000);
    }
    await claimIn(store, 'lease-0', 100);
    await claimIn(store, 'lease-1', 100);
    for (const key of ['kept-0', 'kept-1']) {
      await claimIn(store, key, 100);
      await store.complete(key, `t-${key}`, { statusCode: 200, headers: {} }, 150);
    }
    jest.advanceTimersByTime(200);
    for (let i = 0; i < 4; i++) expect(await claimIn(store, `new-${i}`)).toMatchObject({ status: 'acquired' });
    expect(store.size).toBe(10);
    expect(await held(store, live)).toEqual(live.map(() => true));
    await expect(claimIn(store, 'one-more')).rejects.toThrow(IdempotencyStoreError);
    expect(await held(store, live)).toEqual(live.map(() => true));
  });

  it('is not fooled by the stale expiry of a key released and claimed again, or of a claim since completed', async () => {
    const store = new MemoryIdempotencyStore({ maxEntries: 4 });
    await claimIn(store, 'again', 100);
    await store.release('again', 't-again');
    await claimIn(store, 'again'); // now held for 60 s; its first claim's expiry passes below
    await claimIn(store, 'completed', 100);
    await store.complete('completed', 't-completed', { statusCode: 200, headers: {} }, 60_000);
    await claimIn(store, 'a');
    await claimIn(store, 'b');
    jest.advanceTimersByTime(200);
    await expect(claimIn(store, 'c')).rejects.toThrow('memory store full: 4 live records');
    expect(await held(store, ['again', 'completed', 'a', 'b'])).toEqual([true, true, true, true]);
    expect((await store.get('completed'))?.state).toBe('completed');
  });

  it('keeps a renewed claim past its first expiry when full, and drops it at its renewed one', async () => {
    const store = new MemoryIdempotencyStore({ maxEntries: 2 });
    await claimIn(store, 'renewed', 100);
    expect(await store.renew('renewed', 't-renewed', 1_000)).toBe(true);
    await claimIn(store, 'other');
    jest.advanceTimersByTime(200);
    await expect(claimIn(store, 'new')).rejects.toThrow('memory store full: 2 live records');
    expect(await store.claim({ key: 'renewed', token: 'dup', fingerprint: 'fp', leaseMs: 100 })).toMatchObject({ status: 'in_progress' });
    jest.advanceTimersByTime(1_000);
    expect(await claimIn(store, 'new')).toMatchObject({ status: 'acquired' });
    expect(await held(store, ['renewed', 'other', 'new'])).toEqual([false, true, true]);
  });

  it('stays within maxEntries over many rounds of expiring keys, past released and completed ones', async () => {
    const store = new MemoryIdempotencyStore({ maxEntries: 1000 });
    let refused = 0;
    let largest = 0;
    for (let i = 0; i < 10_000; i++) {
      jest.advanceTimersByTime(1);
      const key = `k${i}`;
      const claimed = await claimIn(store, key, 1_000).catch(() => undefined);
      if (!claimed) refused++;
      else if (i % 3 === 0) await store.release(key, `t-${key}`);
      else if (i % 3 === 1) await store.complete(key, `t-${key}`, { statusCode: 200, headers: {} }, 1_000);
      largest = Math.max(largest, store.size);
    }
    expect(largest).toBeLessThanOrEqual(1000);
    expect(largest).toBeGreaterThan(600);
    expect(refused).toBe(0);
  });
});

describe('MemoryIdempotencyStore under a flood of unique keys', () => {
  const collect = (() => {
    setFlagsFromString('--expose-gc');
    return runInNewContext('gc') as () => void;
  })();
  const heapAfterGc = () => {
    collect();
    collect();
    return process.memoryUsage().heapUsed;
  };

  beforeEach(() => {
    jest.useFakeTimers({ doNotFake: ['hrtime'] });
  });
  afterEach(() => {
    jest.useRealTimers();
  });

  it('stays within its bound: 100,000 keys into a 10,000-entry store as they expire, heap measured before and after', async () => {
    const store = new MemoryIdempotencyStore({ maxEntries: 10_000 });
    const response = { statusCode: 201, headers: { location: '/orders/x' }, body: JSON.stringify({ id: 'x'.repeat(36), amount: 12.5 }) };
    const before = heapAfterGc();
    const started = process.hrtime.bigint();
    for (let i = 0; i < 100_000; i++) {
      // One key per millisecond, each kept 10 s: the store holds exactly its bound of live records.
      // (The store keeps time by the monotonic clock, which advancing the fake timers moves.)
      jest.advanceTimersByTime(1);
      const key = `no_repeat:user-${i % 97}:OrdersController.create:ORD-${i}`;
      await store.claim({ key, token: `t${i}`, fingerprint: 'f'.repeat(64), leaseMs: 30_000 });
      await store.complete(key, `t${i}`, response, 10_000);
    }
    const micros = Number(process.hrtime.bigint() - started) / 1000 / 100_000;
    const grownBytes = heapAfterGc() - before;
    console.log(
      `memory store: ${store.size} entries after 100,000 keys, heap +${(grownBytes / 1e6).toFixed(1)} MB, ` +
        `~${Math.round(grownBytes / store.size)} B per entry, ${micros.toFixed(2)} us per claim + complete`,
    );
    expect(store.size).toBe(10_000);
    // A leak of the 90,000 expired entries (or of stale heap slots) would add well over 2 KB per kept entry.
    expect(grownBytes / store.size).toBeLessThan(2048);
  });
});
