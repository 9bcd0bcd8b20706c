import { afterEach, beforeEach, describe, expect, it, jest } from '@jest/globals';
import { setFlagsFromString } from 'node:v8';
import { runInNewContext } from 'node:vm';
import { describeStoreContract } from '../store-contract.js';
import { MemoryIdempotencyStore } from './memory-idempotency.store.js';

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

  it('stays within maxEntries by dropping the oldest entries', async () => {
    const store = new MemoryIdempotencyStore({ maxEntries: 3 });
    await store.claim({ key: 'short', token: 't', fingerprint: '', leaseMs: 100 });
    await store.claim({ key: 'a', token: 't', fingerprint: '', leaseMs: 60_000 });
    await store.claim({ key: 'b', token: 't', fingerprint: '', leaseMs: 60_000 });
    jest.advanceTimersByTime(200);
    await store.claim({ key: 'c', token: 't', fingerprint: '', leaseMs: 60_000 });
    expect(store.size).toBe(3);
    expect(await store.get('a')).toBeDefined();
    await store.claim({ key: 'd', token: 't', fingerprint: '', leaseMs: 60_000 });
    expect(store.size).toBe(3);
    expect(await store.get('a')).toBeUndefined();
    expect(await store.get('d')).toBeDefined();
  });

  it('keeps dropping the oldest entry first over many rounds, past released and re-claimed keys', async () => {
    const store = new MemoryIdempotencyStore({ maxEntries: 3 });
    const claim = (key: string) => store.claim({ key, token: 't', fingerprint: '', leaseMs: 60_000 });
    for (const key of ['a', 'b', 'c']) await claim(key);
    await store.release('b', 't');
    await claim('d'); // room left by b
    await claim('e'); // drops a
    await claim('b'); // claimed again: now the newest; drops c
    expect(await Promise.all(['a', 'b', 'c', 'd', 'e'].map(async (key) => (await store.get(key)) !== undefined))).toEqual([
      false,
      true,
      false,
      true,
      true,
    ]);
    for (let i = 0; i < 10; i++) await claim(`x${i}`); // many evictions past stale slots
    expect(store.size).toBe(3);
    expect(await Promise.all(['x7', 'x8', 'x9'].map(async (key) => (await store.get(key)) !== undefined))).toEqual([true, true, true]);
  });

  it('counts a key released and claimed again as new: it is not dropped in place of older ones', async () => {
    const store = new MemoryIdempotencyStore({ maxEntries: 3 });
    const claim = (key: string) => store.claim({ key, token: 't', fingerprint: '', leaseMs: 60_000 });
    for (const key of ['a', 'b', 'c']) await claim(key);
    await store.release('a', 't');
    await claim('a'); // the newest now
    await claim('d'); // drops b, the oldest
    expect(await Promise.all(['a', 'b', 'c', 'd'].map(async (key) => (await store.get(key)) !== undefined))).toEqual([
      true,
      false,
      true,
      true,
    ]);
  });

  it('holds no more than maxEntries when flooded with unique keys', async () => {
    const store = new MemoryIdempotencyStore({ maxEntries: 1000 });
    for (let i = 0; i < 10_000; i++) {
      await store.claim({ key: `k${i}`, token: 't', fingerprint: '', leaseMs: 60_000 });
    }
    expect(store.size).toBe(1000);
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

  it('stays within its bound: 100,000 keys into a 10,000-entry store, heap measured before and after', async () => {
    const store = new MemoryIdempotencyStore({ maxEntries: 10_000 });
    const response = { statusCode: 201, headers: { location: '/orders/x' }, body: JSON.stringify({ id: 'x'.repeat(36), amount: 12.5 }) };
    const before = heapAfterGc();
    for (let i = 0; i < 100_000; i++) {
      const key = `no_repeat:user-${i % 97}:OrdersController.create:ORD-${i}`;
      await store.claim({ key, token: `t${i}`, fingerprint: 'f'.repeat(64), leaseMs: 30_000 });
      await store.complete(key, `t${i}`, response, 86_400_000);
    }
    const grownBytes = heapAfterGc() - before;
    console.log(`memory store: ${store.size} entries after 100,000 keys, heap +${(grownBytes / 1e6).toFixed(1)} MB, ~${Math.round(grownBytes / store.size)} B per entry`);
    expect(store.size).toBe(10_000);
    // A leak of the 90,000 dropped entries would add well over 2 KB per kept entry.
    expect(grownBytes / store.size).toBeLessThan(2048);
  });
});
