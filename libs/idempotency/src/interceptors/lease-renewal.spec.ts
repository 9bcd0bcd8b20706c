import { describe, expect, it } from '@jest/globals';
import { performance } from 'node:perf_hooks';
import { LeaseRenewal } from './lease-renewal.js';

// The claim's lease begins in the store when its statement runs, before its answer comes back.
// Counted from the answer, the lease ended here later than in the store (by the answer's way
// back and the wait to read it), and a handler could learn of its lost claim after another
// instance took the key (an adversarial helper, reading the code). It counts from the send.
describe('LeaseRenewal', () => {
  it('counts the lease from when the claim was sent: renews at once when a third has passed, and loses it at the lease end from then', async () => {
    let renewals = 0;
    let lostAt: number | undefined;
    const sentAt = performance.now() - 2000;
    const renewal = new LeaseRenewal(3000, 60_000, {
      renew: () => (renewals++, new Promise<boolean>(() => undefined)), // a store that never answers
      renewed: () => undefined,
      failed: () => undefined,
      lost: () => (lostAt = performance.now()),
    }, false, sentAt);
    try {
      await new Promise((resolve) => setTimeout(resolve, 50));
      expect(renewals).toBe(1);
      for (let waited = 0; lostAt === undefined && waited < 4000; waited += 20) await new Promise((resolve) => setTimeout(resolve, 20));
      // At sentAt + 3000 (about 1 s from now); counted from the call, it was 3 s from now.
      expect(lostAt).toBeDefined();
      expect(lostAt! - sentAt).toBeLessThan(4000);
    } finally {
      renewal.stop();
    }
  });

  it('counts from now without a send time', async () => {
    const renewal = new LeaseRenewal(3000, 60_000, { renew: async () => true, renewed: () => undefined, failed: () => undefined, lost: () => undefined });
    try {
      expect(renewal.leaseEndsAt - Date.now()).toBeGreaterThan(2900);
    } finally {
      renewal.stop();
    }
  });
});
