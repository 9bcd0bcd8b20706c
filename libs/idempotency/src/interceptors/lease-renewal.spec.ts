import { describe, expect, it } from '@jest/globals';
import { performance } from 'node:perf_hooks';
import { LeaseRenewal } from './lease-renewal.js';

// The claim's lease begins in the store when its statement runs, before its answer comes back.
// Counted from the answer, the lease ended here later than in the store (by the answer's way
// back and the wait to read it), and a handler could learn of its lost claim after another
// instance took the key (an adversarial helper, reading the code). It counts from the send, at
// most a tenth of a lease back (a claim that waited long for a pooled connection).
describe('LeaseRenewal', () => {
  const hooks = { renew: () => new Promise<boolean>(() => undefined), renewed: () => undefined, failed: () => undefined, lost: () => undefined };

  it.each([
    ['from the send', 200, 2800],
    ['at most a tenth of a lease back, after a long wait for a connection', 2000, 2700],
    ['from now without a send time', undefined, 3000],
  ])('counts the lease %s', (_how, sentMsAgo, endsInMs) => {
    const renewal = new LeaseRenewal(3000, 60_000, hooks, false, sentMsAgo === undefined ? undefined : performance.now() - sentMsAgo);
    try {
      expect(Math.abs(renewal.leaseEndsAt - Date.now() - endsInMs)).toBeLessThan(50);
    } finally {
      renewal.stop();
    }
  });
});
