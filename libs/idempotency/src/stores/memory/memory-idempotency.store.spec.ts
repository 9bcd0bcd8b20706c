import { afterEach, beforeEach, describe, expect, it, jest } from '@jest/globals';
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

  it('stays within maxEntries, dropping expired entries first, then the oldest', async () => {
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

  it('holds no more than maxEntries when flooded with unique keys', async () => {
    const store = new MemoryIdempotencyStore({ maxEntries: 1000 });
    for (let i = 0; i < 10_000; i++) {
      await store.claim({ key: `k${i}`, token: 't', fingerprint: '', leaseMs: 60_000 });
    }
    expect(store.size).toBe(1000);
  });
});
