import { describe, expect, it } from '@jest/globals';
import { MemoryIdempotencyStore } from '../stores/memory/memory-idempotency.store.js';
import type { SettleWatch } from '../stores/idempotency-store.js';
import { awaitSettled } from './await-settled.js';

/**
 * A store whose settlement notices never arrive, as Redis pub/sub drops a message while its
 * subscriber reconnects: a stub of that one method, because a real store cannot be made to lose
 * exactly one notice on cue.
 */
class DeafStore extends MemoryIdempotencyStore {
  override async watch(): Promise<SettleWatch> {
    return { settled: new Promise<void>(() => undefined), cancel: () => undefined };
  }
}

const sleep = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms));

/** `key` held by a first claim, and a duplicate's claim that found it in progress. */
async function heldByAnother(store: DeafStore, key: string) {
  const first = { key, token: 'first', fingerprint: 'f', leaseMs: 60_000 };
  await store.claim(first);
  const duplicate = { ...first, token: 'second' };
  const found = await store.claim(duplicate);
  expect(found.status).toBe('in_progress');
  return { duplicate, found };
}

describe('awaitSettled', () => {
  it('claims once more at its bound, so a settlement whose notice was lost is still replayed, not answered 409', async () => {
    const store = new DeafStore();
    const { duplicate, found } = await heldByAnother(store, 'k');
    const waited = awaitSettled(store, duplicate, found, 300, () => undefined);
    await sleep(50);
    await store.complete('k', 'first', { statusCode: 201, headers: {}, body: '{}' }, 60_000);
    expect((await waited).status).toBe('completed');
  });
});

describe('awaitSettled when the store fails its last look', () => {
  it('answers as the wait did (in progress), not with the store\'s error', async () => {
    const store = new DeafStore();
    const { duplicate, found } = await heldByAnother(store, 'k2');
    const claim = store.claim.bind(store);
    let calls = 0;
    // The re-claim right after the watch answers; the one at the bound fails (the store went down).
    store.claim = (input) => (++calls >= 2 ? Promise.reject(new Error('store down')) : claim(input));
    await expect(awaitSettled(store, duplicate, found, 200, () => undefined)).resolves.toMatchObject({ status: 'in_progress' });
  });

  // An adversarial helper (session 19): the look right after the watch had no catch, so its
  // failure became the guard's outage, and a fail-open route ran every waiter beside the holder.
  // An adversarial helper: a look that failed ended the wait at once, and an event copy was
  // dropped; when the first delivery then failed, the event was lost (5 of 5, Redis stalled).
  it('goes on waiting through failed looks: a first that failed meanwhile lets it run', async () => {
    const store = new DeafStore();
    const { duplicate, found } = await heldByAnother(store, 'k5');
    const claim = store.claim.bind(store);
    let calls = 0;
    // The store stalls for the first looks; the holder's handler fails meanwhile.
    store.claim = (input) => (++calls <= 3 ? Promise.reject(new Error('no answer within 1000 ms')) : claim(input));
    setTimeout(() => void store.release('k5', 'first'), 150);
    const failures: unknown[] = [];
    await expect(awaitSettled(store, duplicate, found, 5_000, (error) => failures.push(error))).resolves.toMatchObject({ status: 'acquired' });
    expect(failures).toHaveLength(1);
  });

  it('answers in progress when every look while waiting fails, reports the failure once, and frees what the looks may have claimed', async () => {
    const store = new DeafStore();
    const { duplicate, found } = await heldByAnother(store, 'k4');
    const claim = store.claim.bind(store);
    store.claim = async (input) => {
      await store.release('k4', 'first'); // the holder's handler failed meanwhile
      await claim(input); // the look lands...
      throw new Error('no answer within 1000 ms'); // ...after the caller stopped waiting for it
    };
    const failures: unknown[] = [];
    await expect(awaitSettled(store, duplicate, found, 500, (error) => failures.push(error))).resolves.toMatchObject({ status: 'in_progress' });
    expect(failures).toHaveLength(1);
    await sleep(10);
    expect(await store.get('k4')).toBeUndefined();
  });

  // A slow store's claim can fail at the caller (a timeout) and still land: the holder released
  // meanwhile, so the late claim takes the key for a token nobody runs, and every retry got 409
  // until its lease ended. The waiter frees what it may have claimed (compare-and-delete).
  it('frees the key its failed last look may still have claimed', async () => {
    const store = new DeafStore();
    const { duplicate, found } = await heldByAnother(store, 'k3');
    const claim = store.claim.bind(store);
    let calls = 0;
    store.claim = async (input) => {
      if (++calls < 2) return claim(input);
      await store.release('k3', 'first'); // the holder's handler failed meanwhile
      await claim(input); // the claim lands...
      throw new Error('no answer within 1000 ms'); // ...after the caller stopped waiting
    };
    await expect(awaitSettled(store, duplicate, found, 200, () => undefined)).resolves.toMatchObject({ status: 'in_progress' });
    await sleep(10);
    expect(await store.get('k3')).toBeUndefined();
  });
});

/**
 * A store whose watch fails, as Redis refuses SUBSCRIBE to a user whose ACL leaves it out
 * (NOPERM): a stub, because the test Redis is shared and its users are not the test's to change.
 */
class NoSubscribeStore extends MemoryIdempotencyStore {
  override async watch(): Promise<SettleWatch> {
    throw new Error('NOPERM this user has no permissions to run the \'subscribe\' command');
  }
}

// An adversarial helper: a wait whose watch failed ended at once, in progress: an event copy was
// dropped, and lost when the first delivery then failed. The README says waiters sleep to their
// bound instead of being woken.
describe('awaitSettled on a store that cannot watch', () => {
  it('reports it once, sleeps to its bound, and looks again: a first that failed meanwhile lets it run', async () => {
    const store = new NoSubscribeStore();
    const first = { key: 'ns', token: 'first', fingerprint: 'f', leaseMs: 60_000 };
    await store.claim(first);
    const duplicate = { ...first, token: 'second' };
    const found = await store.claim(duplicate);
    const errors: unknown[] = [];
    const waited = awaitSettled(store, duplicate, found, 300, (error) => errors.push(error));
    await sleep(50);
    await store.release('ns', 'first');
    // Observed before: in_progress at once.
    expect(await waited).toEqual({ status: 'acquired', token: 'second' });
    expect(errors).toHaveLength(1);
  });
});

describe('awaitSettled on a store that cannot watch, with a bound past the holder\'s lease', () => {
  it('looks again at the holder\'s lease end, not only at its bound', async () => {
    const store = new NoSubscribeStore();
    const first = { key: 'ns2', token: 'first', fingerprint: 'f', leaseMs: 300 };
    await store.claim(first);
    const duplicate = { ...first, token: 'second' };
    const found = await store.claim(duplicate);
    const startedAt = Date.now();
    const waited = awaitSettled(store, duplicate, found, 5000, () => undefined);
    await sleep(50);
    await store.release('ns2', 'first');
    expect(await waited).toEqual({ status: 'acquired', token: 'second' });
    // The first version looked only at the bound (5 s).
    expect(Date.now() - startedAt).toBeLessThan(1500);
  });
});
