import { randomUUID } from 'node:crypto';
import { buildStorageKey, MAX_KEY_LENGTH, type SavedResponse, type UnreplayableReason } from '../index.js';
import { globalTestApi, type ContractSubject, type ContractTestApi, type StoreHarness } from './contract-api.js';
import { describeForgetCases } from './forget.contract.js';
import { describeRenewalCases } from './lease-renewal.contract.js';

const response: SavedResponse = {
  statusCode: 201,
  headers: { location: '/orders/A-1', 'content-type': 'application/json; charset=utf-8' },
  body: '{"id":"1","orderNo":"A-1","note":"ü \\" :{}"}',
};

/** Bytes that are not UTF-8 (0x00 0xFF 0x0A 0x80), saved as base64. */
const binary: SavedResponse = {
  statusCode: 200,
  headers: { 'content-type': 'application/octet-stream' },
  body: Buffer.from([0x00, 0xff, 0x0a, 0x80]).toString('base64'),
  encoding: 'base64',
};

/**
 * The longest client key the guard accepts (`MAX_KEY_LENGTH` characters), of 4-byte UTF-8
 * characters (12 characters each once percent-encoded), ending in `last`.
 */
export function longestClientKey(last: string): string {
  return '\u{1F600}'.repeat(MAX_KEY_LENGTH - 1) + last;
}

/** The storage key of `longestClientKey(last)` under a user id of 1,000 4-byte characters. */
function longestKey(prefix: string, last: string): string {
  const user = { id: '\u{1F47E}'.repeat(1000) };
  return buildStorageKey({ prefix, user, handler: 'OrdersController.create', key: longestClientKey(last) });
}

async function isPending(promise: Promise<unknown>): Promise<boolean> {
  const pending = Symbol('pending');
  return (await Promise.race([promise, Promise.resolve(pending)])) === pending;
}

/**
 * The behaviour every `IdempotencyStore` must show, as one `describe` block of the test runner.
 * Leases here are short (`leaseMs`) so that expiry can be exercised; a store on real time should
 * pass a few hundred milliseconds. `test`: the runner's functions, by default its globals.
 */
export function describeStoreContract(
  name: string,
  makeHarness: () => Promise<StoreHarness>,
  leaseMs = 300,
  test: ContractTestApi = globalTestApi(),
): void {
  const { describe, it, beforeEach, afterEach, expect } = test;
  describe(`${name}: IdempotencyStore contract`, () => {
    let h: StoreHarness;
    let key: string;
    const claim = (token: string, fingerprint = 'fp-1', lease = leaseMs) =>
      h.store.claim({ key, token, fingerprint, leaseMs: lease });

    const subject: ContractSubject = {
      get store() {
        return h.store;
      },
      get key() {
        return key;
      },
      elapse: (ms) => h.elapse(ms),
      claim,
      get writeForeignValue() {
        return h.writeForeignValue?.bind(h);
      },
    };

    beforeEach(async () => {
      h = await makeHarness();
      key = `contract:${randomUUID()}`;
    });
    afterEach(async () => {
      // A harness that failed to build leaves none to close (the real error is the factory's).
      const built = h as StoreHarness | undefined;
      h = undefined as unknown as StoreHarness;
      await built?.close?.();
    });

    it('gives a free key to the first claim and reports it in progress to the next', async () => {
      expect(await claim('t1')).toEqual({ status: 'acquired', token: 't1' });
      const second = await claim('t2');
      expect(second.status).toBe('in_progress');
      if (second.status !== 'in_progress') return;
      expect(second.retryAfterMs).toBeGreaterThan(0);
      expect(second.retryAfterMs).toBeLessThanOrEqual(leaseMs);
    });

    it('replays the saved response after the owner completes', async () => {
      await claim('t1');
      expect(await h.store.complete(key, 't1', response, 60_000)).toBe(true);
      expect(await claim('t2')).toEqual({ status: 'completed', response });
      const record = await h.store.get(key);
      expect(record).toMatchObject({ state: 'completed', token: 't1', fingerprint: 'fp-1', response });
      expect(record!.ttlMs).toBeGreaterThan(leaseMs);
    });

    it('keeps a response without a body as one without a body', async () => {
      await claim('t1');
      const empty: SavedResponse = { statusCode: 204, headers: {} };
      expect(await h.store.complete(key, 't1', empty, 60_000)).toBe(true);
      expect(await claim('t2')).toEqual({ status: 'completed', response: empty });
    });

    it('keeps a base64 body with its encoding, and sets neither flag on a response that has none', async () => {
      await claim('t1');
      expect(await h.store.complete(key, 't1', binary, 60_000)).toBe(true);
      expect(await claim('t2')).toStrictEqual({ status: 'completed', response: binary });
      expect((await h.store.get(key))?.response).toStrictEqual(binary);
      const plain = `${key}:plain`;
      await h.store.claim({ key: plain, token: 't1', fingerprint: 'fp-1', leaseMs });
      await h.store.complete(plain, 't1', response, 60_000);
      expect(await h.store.claim({ key: plain, token: 't2', fingerprint: 'fp-1', leaseMs })).toStrictEqual({ status: 'completed', response });
    });

    it('keeps a completed record that is not replayable, with its reason and no body', async () => {
      for (const reason of ['too_large', 'not_delivered', 'server_error', 'not_serializable', 'partial'] satisfies UnreplayableReason[]) {
        const unreplayable = `${key}:${reason}`;
        const saved: SavedResponse = { statusCode: 201, headers: {}, unreplayable: reason };
        await h.store.claim({ key: unreplayable, token: 't1', fingerprint: 'fp-1', leaseMs });
        expect(await h.store.complete(unreplayable, 't1', saved, 60_000)).toBe(true);
        expect(await h.store.claim({ key: unreplayable, token: 't2', fingerprint: 'fp-1', leaseMs })).toStrictEqual({
          status: 'completed',
          response: saved,
        });
        expect(await h.store.get(unreplayable)).toMatchObject({ state: 'completed', token: 't1', response: saved });
      }
    });

    it('takes the longest valid client key of 4-byte characters under a long user id, and keeps two such keys apart', async () => {
      const [first, second] = [longestKey(key, '\u{1F600}'), longestKey(key, '\u{1F601}')];
      const claimOf = (storageKey: string, token: string) => h.store.claim({ key: storageKey, token, fingerprint: 'fp-1', leaseMs: 60_000 });
      expect(await claimOf(first, 'a1')).toEqual({ status: 'acquired', token: 'a1' });
      expect(await claimOf(first, 'a2')).toMatchObject({ status: 'in_progress' });
      expect(await claimOf(second, 'b1')).toEqual({ status: 'acquired', token: 'b1' });
      expect(await h.store.release(second, 'b1')).toBe(true);
      expect(await claimOf(second, 'b2')).toEqual({ status: 'acquired', token: 'b2' });
      const other: SavedResponse = { ...response, body: '{"id":"2"}' };
      expect(await h.store.complete(first, 'a1', response, 60_000)).toBe(true);
      expect(await h.store.complete(second, 'b2', other, 60_000)).toBe(true);
      expect(await claimOf(first, 'a3')).toEqual({ status: 'completed', response });
      expect(await claimOf(second, 'b3')).toEqual({ status: 'completed', response: other });
      expect(await h.store.get(first)).toMatchObject({ state: 'completed', token: 'a1', response });
    });

    it('reports a different fingerprint as a mismatch, while processing and after completion', async () => {
      await claim('t1', 'fp-1');
      expect(await claim('t2', 'fp-2')).toEqual({ status: 'mismatch' });
      await h.store.complete(key, 't1', response, 60_000);
      expect(await claim('t3', 'fp-2')).toEqual({ status: 'mismatch' });
      expect(await claim('t4', '')).toEqual({ status: 'completed', response });
    });

    it('lets only the owner release, and frees the key for the next claim', async () => {
      await claim('t1');
      expect(await h.store.release(key, 'other')).toBe(false);
      expect((await claim('t2')).status).toBe('in_progress');
      expect(await h.store.release(key, 't1')).toBe(true);
      expect(await h.store.get(key)).toBeUndefined();
      expect(await claim('t3')).toEqual({ status: 'acquired', token: 't3' });
    });

    it('lets only the owner complete', async () => {
      await claim('t1');
      expect(await h.store.complete(key, 'other', response, 60_000)).toBe(false);
      expect(await h.store.get(key)).toMatchObject({ state: 'processing', token: 't1' });
    });

    it('never releases a completed record', async () => {
      await claim('t1');
      await h.store.complete(key, 't1', response, 60_000);
      expect(await h.store.release(key, 't1')).toBe(false);
      expect((await h.store.get(key))?.state).toBe('completed');
    });

    it('frees the key when the lease runs out, and fences the stale owner', async () => {
      await claim('stale');
      await h.elapse(leaseMs + 100);
      expect(await claim('fresh')).toEqual({ status: 'acquired', token: 'fresh' });
      expect(await h.store.complete(key, 'stale', response, 60_000)).toBe(false);
      expect(await h.store.release(key, 'stale')).toBe(false);
      expect(await h.store.get(key)).toMatchObject({ state: 'processing', token: 'fresh' });
      expect(await h.store.complete(key, 'fresh', response, 60_000)).toBe(true);
    });

    it('refuses a completion after the lease ran out even when nobody claimed again', async () => {
      await claim('slow');
      await h.elapse(leaseMs + 100);
      expect(await h.store.complete(key, 'slow', response, 60_000)).toBe(false);
      expect(await h.store.get(key)).toBeUndefined();
    });

    it('forgets a completed response after its retention', async () => {
      await claim('t1');
      await h.store.complete(key, 't1', response, leaseMs);
      await h.elapse(leaseMs + 100);
      expect(await claim('t2')).toEqual({ status: 'acquired', token: 't2' });
    });

    it('gives the key to exactly one of many concurrent claims', async () => {
      const results = await Promise.all(Array.from({ length: 50 }, (_, i) => claim(`t${i}`, 'fp', 60_000)));
      expect(results.filter((r) => r.status === 'acquired')).toHaveLength(1);
      expect(results.filter((r) => r.status === 'in_progress')).toHaveLength(49);
    });

    it('wakes a watcher of a processing key when its owner completes, and the re-claim replays', async () => {
      await claim('t1');
      const watch = await h.store.watch(key);
      expect((await h.store.claim({ key, token: 't2', fingerprint: 'fp-1', leaseMs, wait: true })).status).toBe('in_progress');
      expect(await isPending(watch.settled)).toBe(true);
      await h.store.complete(key, 't1', response, 60_000);
      await watch.settled;
      watch.cancel();
      expect(await claim('t3')).toEqual({ status: 'completed', response });
    });

    it('wakes a watcher when the owner releases, and the re-claim acquires', async () => {
      await claim('t1');
      const watch = await h.store.watch(key);
      await h.store.claim({ key, token: 't2', fingerprint: 'fp-1', leaseMs, wait: true });
      await h.store.release(key, 't1');
      await watch.settled;
      watch.cancel();
      expect(await claim('t3')).toEqual({ status: 'acquired', token: 't3' });
    });

    it('keeps keys apart', async () => {
      await claim('t1');
      const other = `${key}:other`;
      expect(await h.store.claim({ key: other, token: 't2', fingerprint: 'fp-1', leaseMs })).toEqual({
        status: 'acquired',
        token: 't2',
      });
    });

    describeRenewalCases(subject, leaseMs, test);
    describeForgetCases(subject, leaseMs, test);
  });
}
