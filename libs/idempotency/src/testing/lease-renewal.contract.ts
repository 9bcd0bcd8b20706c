import type { SavedResponse } from '../index.js';
import type { ContractSubject, ContractTestApi } from './contract-api.js';

const saved: SavedResponse = { statusCode: 201, headers: { location: '/orders/A-1' }, body: '{"id":"1"}' };

/**
 * The contract of `renew`, part of `describeStoreContract`: only the live holder extends its
 * claim, each renewal counts from now, and a refused renewal changes nothing.
 */
export function describeRenewalCases(t: ContractSubject, leaseMs: number, { it, expect }: ContractTestApi): void {
  /** A lease well past the wait of `elapse(leaseMs + 100)`, so a renewed claim is clearly still live. */
  const longLease = leaseMs * 10;

  it('lets the holder renew its claim past its first lease, then complete it', async () => {
    await t.claim('t1');
    expect(await t.store.renew(t.key, 't1', longLease)).toBe(true);
    await t.elapse(leaseMs + 100);
    const duplicate = await t.claim('t2');
    expect(duplicate.status).toBe('in_progress');
    // The retry hint follows the renewed lease, not the first one (long gone by now).
    expect(duplicate.status === 'in_progress' && duplicate.retryAfterMs).toBeGreaterThan(leaseMs / 2);
    const record = await t.store.get(t.key);
    expect(record).toMatchObject({ state: 'processing', token: 't1', fingerprint: 'fp-1' });
    expect(record!.ttlMs).toBeGreaterThan(leaseMs);
    expect(await t.store.complete(t.key, 't1', saved, 60_000)).toBe(true);
    expect(await t.claim('t3')).toEqual({ status: 'completed', response: saved });
  });

  it('counts a renewal from now: renewing to a short lease ends the claim then', async () => {
    await t.claim('t1', 'fp-1', 60_000);
    expect(await t.store.renew(t.key, 't1', leaseMs)).toBe(true);
    expect((await t.store.get(t.key))!.ttlMs).toBeLessThanOrEqual(leaseMs);
    await t.elapse(leaseMs + 100);
    expect(await t.claim('t2')).toEqual({ status: 'acquired', token: 't2' });
  });

  it('refuses a renewal by another token and leaves the claim as it was', async () => {
    await t.claim('t1');
    // 't' and 't11' would pass a check that compares token prefixes carelessly.
    for (const other of ['other', 't', 't11', '']) expect(await t.store.renew(t.key, other, longLease)).toBe(false);
    const record = await t.store.get(t.key);
    expect(record).toMatchObject({ state: 'processing', token: 't1', fingerprint: 'fp-1' });
    expect(record!.ttlMs).toBeLessThanOrEqual(leaseMs);
    await t.elapse(leaseMs + 100);
    expect(await t.claim('t2')).toEqual({ status: 'acquired', token: 't2' });
  });

  it('refuses a stale holder whose lease ran out, before and after a new claim, and leaves the new owner alone', async () => {
    await t.claim('stale');
    await t.elapse(leaseMs + 100);
    expect(await t.store.renew(t.key, 'stale', longLease)).toBe(false);
    expect(await t.store.get(t.key)).toBeUndefined();
    expect(await t.claim('fresh', 'fp-1', longLease)).toEqual({ status: 'acquired', token: 'fresh' });
    expect(await t.store.renew(t.key, 'stale', 10 * longLease)).toBe(false);
    const record = await t.store.get(t.key);
    expect(record).toMatchObject({ state: 'processing', token: 'fresh' });
    expect(record!.ttlMs).toBeLessThanOrEqual(longLease);
    expect(await t.store.renew(t.key, 'fresh', longLease)).toBe(true);
    expect(await t.store.complete(t.key, 'fresh', saved, 60_000)).toBe(true);
  });

  it('refuses to renew a completed record and keeps its retention, longer or shorter than the lease asked', async () => {
    const [short, long] = [`${t.key}:short`, `${t.key}:long`];
    for (const [key, retentionMs] of [[short, leaseMs], [long, 60_000]] as const) {
      await t.store.claim({ key, token: 't1', fingerprint: 'fp-1', leaseMs });
      expect(await t.store.complete(key, 't1', saved, retentionMs)).toBe(true);
    }
    expect(await t.store.renew(short, 't1', 60_000)).toBe(false);
    expect(await t.store.renew(long, 't1', leaseMs)).toBe(false);
    const record = await t.store.get(short);
    expect(record).toMatchObject({ state: 'completed', token: 't1', response: saved });
    expect(record!.ttlMs).toBeLessThanOrEqual(leaseMs);
    await t.elapse(leaseMs + 100);
    expect(await t.store.claim({ key: short, token: 't2', fingerprint: 'fp-1', leaseMs })).toEqual({ status: 'acquired', token: 't2' });
    expect(await t.store.claim({ key: long, token: 't2', fingerprint: 'fp-1', leaseMs })).toEqual({ status: 'completed', response: saved });
  });

  it('refuses to renew a released claim, and does not bring the key back', async () => {
    await t.claim('t1');
    expect(await t.store.release(t.key, 't1')).toBe(true);
    expect(await t.store.renew(t.key, 't1', longLease)).toBe(false);
    expect(await t.store.get(t.key)).toBeUndefined();
    expect(await t.claim('t2')).toEqual({ status: 'acquired', token: 't2' });
  });

  it('renews under many concurrent renewals and duplicates: every renewal holds, one claim stays', async () => {
    await t.claim('t1');
    const renewals = Array.from({ length: 20 }, () => t.store.renew(t.key, 't1', longLease));
    const duplicates = Array.from({ length: 20 }, (_, i) => t.claim(`dup-${i}`));
    const [renewed, claimed] = await Promise.all([Promise.all(renewals), Promise.all(duplicates)]);
    expect(renewed.filter((ok) => ok)).toHaveLength(20);
    expect(claimed.filter((result) => result.status === 'in_progress')).toHaveLength(20);
    await t.elapse(leaseMs + 100);
    expect(await t.store.get(t.key)).toMatchObject({ state: 'processing', token: 't1' });
    expect(await t.store.complete(t.key, 't1', saved, 60_000)).toBe(true);
  });
}
