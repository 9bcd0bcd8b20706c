import { IdempotencyNotARecordError, type SavedResponse } from '../index.js';
import type { ContractSubject, ContractTestApi } from './contract-api.js';

const saved: SavedResponse = { statusCode: 201, headers: { location: '/orders/A-1' }, body: '{"id":"1"}' };

/**
 * The contract of `forget`, part of `describeStoreContract`: a completed record is deleted and
 * its key runs again; a claim in progress is refused and stays fenced; nothing is `absent`; a
 * value that is no record is `not_a_record` and stays (stores whose keyspace the app shares); and
 * a forget racing claims of the same key never deletes the claim that took it.
 */
export function describeForgetCases(t: ContractSubject, leaseMs: number, { it, expect }: ContractTestApi): void {
  /** Claims `key` as `token` and completes it, kept a minute. */
  const completed = async (key: string, token: string) => {
    await t.store.claim({ key, token, fingerprint: 'fp-1', leaseMs });
    expect(await t.store.complete(key, token, saved, 60_000)).toBe(true);
  };

  it('forgets a completed record: the next claim of its key wins, other keys keep theirs', async () => {
    const other = `${t.key}:other`;
    await completed(t.key, 't1');
    await completed(other, 'o1');
    expect(await t.store.forget(t.key)).toEqual({ forgotten: true });
    expect(await t.store.get(t.key)).toBeUndefined();
    expect(await t.claim('t2')).toEqual({ status: 'acquired', token: 't2' });
    expect(await t.store.get(other)).toMatchObject({ state: 'completed', token: 'o1', response: saved });
    // Forgotten once: the new claim is in progress, so a second forget is refused.
    expect(await t.store.forget(t.key)).toEqual({ forgotten: false, reason: 'in_progress' });
  });

  it('refuses to forget a claim in progress: the claim stays fenced, its owner completes it', async () => {
    await t.claim('t1');
    expect(await t.store.forget(t.key)).toEqual({ forgotten: false, reason: 'in_progress' });
    expect(await t.store.get(t.key)).toMatchObject({ state: 'processing', token: 't1', fingerprint: 'fp-1' });
    expect((await t.claim('t2')).status).toBe('in_progress');
    expect(await t.store.renew(t.key, 't1', leaseMs)).toBe(true);
    expect(await t.store.complete(t.key, 't1', saved, 60_000)).toBe(true);
    expect(await t.claim('t3')).toEqual({ status: 'completed', response: saved });
  });

  it('answers absent to a forget of a key never claimed, released, or past its retention, and creates nothing', async () => {
    expect(await t.store.forget(t.key)).toEqual({ forgotten: false, reason: 'absent' });
    expect(await t.store.get(t.key)).toBeUndefined();
    await t.claim('t1');
    expect(await t.store.release(t.key, 't1')).toBe(true);
    expect(await t.store.forget(t.key)).toEqual({ forgotten: false, reason: 'absent' });
    const expiring = `${t.key}:expiring`;
    await t.store.claim({ key: expiring, token: 'e1', fingerprint: 'fp-1', leaseMs });
    expect(await t.store.complete(expiring, 'e1', saved, leaseMs)).toBe(true);
    await t.elapse(leaseMs + 100);
    expect(await t.store.forget(expiring)).toEqual({ forgotten: false, reason: 'absent' });
    expect(await t.claim('t2')).toEqual({ status: 'acquired', token: 't2' });
  });

  it('leaves a value that is no record as it is: forget answers not_a_record, get throws IdempotencyNotARecordError (a shared keyspace)', async () => {
    // A store that holds only its own records has no such value to meet.
    if (!t.writeForeignValue) return;
    const intact = await t.writeForeignValue(t.key);
    expect(await t.store.forget(t.key)).toEqual({ forgotten: false, reason: 'not_a_record' });
    const read = await t.store.get(t.key).then(
      (record) => record,
      (error: unknown) => (error instanceof IdempotencyNotARecordError ? 'not_a_record' : error),
    );
    expect(read).toBe('not_a_record');
    expect(await intact()).toBe(true);
  });

  it('never deletes a claim that took the key while forgets race claims of it (forgets and claims in loops, at once)', async () => {
    const lost: string[] = [];
    let forgotten = 0;
    const forgetting = async (key: string) => {
      for (let i = 0; i < 30; i++) if ((await t.store.forget(key)).forgotten) forgotten++;
    };
    // Each claim that takes the key completes it at once, so that forgets find a record to take
    // again; a forget that deleted the claim before that would leave `complete` refused.
    const claiming = async (key: string, worker: number) => {
      for (let i = 0; i < 30; i++) {
        const token = `w${worker}-${i}`;
        const claim = await t.store.claim({ key, token, fingerprint: 'fp-1', leaseMs: 60_000 });
        if (claim.status === 'acquired' && !(await t.store.complete(key, token, saved, 60_000))) lost.push(`${key} ${token}`);
      }
    };
    const keys = [1, 2, 3, 4, 5, 6].map((k) => `${t.key}:race-${k}`);
    for (const key of keys) await completed(key, 'first');
    await Promise.all(keys.flatMap((key) => [1, 2, 3, 4].flatMap((worker) => [forgetting(key), claiming(key, worker)])));
    expect(lost).toEqual([]);
    expect(forgotten > 0).toBe(true);
    // What is left is a whole record: completed, or nothing after a last forget.
    for (const key of keys) expect([undefined, 'completed'].includes((await t.store.get(key))?.state)).toBe(true);
  });
}
