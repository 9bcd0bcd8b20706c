import { SETTLE_POLL_MS, type ClaimInput, type ClaimResult, type IdempotencyStore, type SettleWatch } from '../stores/idempotency-store.js';

/**
 * Waits for a processing key to settle, up to `waitMs`: watch, re-claim (so a settlement in
 * between is not missed), then sleep until the store pushes the settlement or the lease ends.
 * A sleep that reaches the bound claims once more: a notice can be lost (pub/sub drops messages
 * while its connection is down). Returns the last claim: completed (replay), acquired (the first
 * one failed: run), or still in progress at the bound (409). A look the store fails is reported
 * once (`onWatchError`) and counts as in progress: the wait sleeps SETTLE_POLL_MS and looks again,
 * up to its bound; one that cannot watch is reported once, and the wait sleeps (to the holder's
 * lease end, or the bound) and looks again.
 * A waiter is a known duplicate of a live call, so a store failure never becomes an outage for
 * it (on a fail-open route that ran the handler beside the holder).
 */
export async function awaitSettled(
  store: IdempotencyStore,
  input: ClaimInput,
  first: ClaimResult,
  waitMs: number,
  onWatchError: (error: unknown) => void,
): Promise<ClaimResult> {
  const deadline = Date.now() + waitMs;
  let claim = first;
  let slept = false;
  // A store that cannot watch (Redis refusing SUBSCRIBE to an ACL user) is reported once, and
  // the wait sleeps to its bound instead of being woken: ended at once, an event copy was
  // dropped, and lost when the first delivery then failed (an adversarial helper).
  let watching = true;
  // A look that fails (a store that stalls) is reported once and the wait goes on: ended at once,
  // an event copy was dropped, and lost when the first delivery then failed (an adversarial
  // helper: 5 of 5 events, NATS and TCP, Redis stopped 2.5 s).
  let reported = false;
  while (claim.status === 'in_progress') {
    const leftMs = deadline - Date.now();
    if (leftMs <= 0) {
      // The last look, after a sleep: a notice of the settlement may have been lost.
      if (slept) claim = await lookAgain(store, input, claim);
      break;
    }
    let watch: SettleWatch | undefined;
    if (watching) {
      try {
        watch = await store.watch(input.key);
      } catch (error) {
        onWatchError(error);
        watching = false;
      }
    }
    let timer: NodeJS.Timeout | undefined;
    try {
      // Watched, a look right away (a settlement before the watch is not missed); not, a look
      // after each sleep.
      let failed = false;
      if (watch || slept) {
        claim = await lookAgain(store, input, claim, (error) => {
          failed = true;
          if (!reported) onWatchError(error);
          reported = true;
        });
        // A failed look leaves the claim the wait had: in progress.
        if (claim.status !== 'in_progress') break;
      }
      // Unwatched, at least SETTLE_POLL_MS apart (a holder whose lease is all but over); after a
      // failed look, SETTLE_POLL_MS, and the wait goes on to its bound.
      const sleepMs = Math.min(
        leftMs,
        failed ? SETTLE_POLL_MS : watch ? claim.retryAfterMs + 1 : Math.max(claim.retryAfterMs + 1, SETTLE_POLL_MS),
      );
      const sleeping = new Promise((resolve) => (timer = setTimeout(resolve, sleepMs)));
      await (watch ? Promise.race([watch.settled, sleeping]) : sleeping);
      slept = true;
    } finally {
      clearTimeout(timer);
      watch?.cancel();
    }
  }
  return claim;
}

/**
 * Claims again while waiting. A store that fails the look leaves the answer the wait had (in
 * progress). The failed claim may still land (a slow store) on a key the holder freed meanwhile:
 * freed again (compare-and-delete by this call's token), it does not hold the key for a lease.
 */
function lookAgain(store: IdempotencyStore, input: ClaimInput, had: ClaimResult, onError?: (error: unknown) => void): Promise<ClaimResult> {
  return store.claim({ ...input, wait: true }).catch((error: unknown) => {
    onError?.(error);
    store.release(input.key, input.token).catch(() => undefined);
    return had;
  });
}
