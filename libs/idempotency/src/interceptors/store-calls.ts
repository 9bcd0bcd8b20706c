import type { Logger } from '@nestjs/common';
import { performance } from 'node:perf_hooks';
import type { CallEvents } from '../events/call-events.js';
import type { IdempotencyCounters } from '../metrics/idempotency-counters.js';
import type { ClaimInput, IdempotencyStore, SavedResponse } from '../stores/idempotency-store.js';
import type { HeldClaim } from './exchange.js';
import { LeaseRenewal } from './lease-renewal.js';
import type { GuardedRoute } from './route-options.js';

type StoreOperation = 'claim' | 'complete' | 'release' | 'renew';

/** The signal of a claim that is never renewed (fail-open): nothing to lose. */
const NEVER_ABORTED = new AbortController().signal;

/**
 * The guard's calls to its store, timed when the call's events are listened to, with what each
 * result means for the key: counted, reported (`events`, undefined when nobody listens), logged,
 * and (for a failed save) tried again until the lease ends.
 */
export class StoreCalls {
  constructor(
    private readonly store: IdempotencyStore,
    private readonly counters: IdempotencyCounters,
    private readonly logger: Logger,
  ) {}

  /**
   * The claim this run holds, renewed while the handler runs; or, after a failed claim, the one
   * it may hold (`uncertain`: not renewed, the store is down).
   */
  hold({ key: storageKey, token }: ClaimInput, route: GuardedRoute, uncertain: boolean, events: CallEvents | undefined): HeldClaim {
    events?.held();
    const renewal = uncertain ? undefined : this.renewal(storageKey, token, route, events);
    const claimedAt = Date.now();
    return {
      holdMs: renewal ? route.maxHoldMs : route.leaseMs,
      // Read only by `@LeaseSignal()`: the renewal makes its AbortController then.
      get signal() {
        return renewal?.signal ?? NEVER_ABORTED;
      },
      save: (response) => {
        events?.settled(); // handlerMs: the answer is ready; the save's round trip is a store_call
        renewal?.stop();
        const leaseEndsAt = renewal?.leaseEndsAt ?? claimedAt + route.leaseMs;
        return this.save(storageKey, token, response, route, leaseEndsAt, uncertain, events);
      },
      release: () => {
        events?.settled();
        renewal?.stop();
        return this.release(storageKey, token, route.handler, events);
      },
    };
  }

  private renewal(storageKey: string, token: string, route: GuardedRoute, events: CallEvents | undefined): LeaseRenewal {
    const { handler, leaseMs } = route;
    return new LeaseRenewal(leaseMs, route.maxHoldMs, {
      renew: () => this.timed('renew', events, () => this.store.renew(storageKey, token, leaseMs)),
      renewed: () => {
        this.counters.count('renewed', handler);
        events?.emit('renewed', {});
      },
      failed: (error) => {
        this.counters.count('storeErrors', handler);
        events?.emit('store_error', { operation: 'renew', error });
        this.logger.warn(`${handler}: could not renew the claim (${(error as Error).message}); trying again until its lease ends`);
      },
      lost: (why) => {
        this.counters.count('leasesLost', handler);
        events?.emit('lease_lost', { reason: why });
        this.logger.error(`${handler}: lost the claim while the handler runs (${why}); a retry may run the handler again`);
      },
    });
  }

  /**
   * Saves the answer. A save that fails is tried again in the background until the lease ends:
   * the effect happened, and a key left processing would refuse retries, then run them again.
   */
  private async save(
    storageKey: string,
    token: string,
    response: SavedResponse,
    route: GuardedRoute,
    leaseEndsAt: number,
    uncertain: boolean,
    events: CallEvents | undefined,
  ) {
    try {
      const saved = await this.timed('complete', events, () => this.store.complete(storageKey, token, response, route.expireMs));
      if (saved) {
        events?.emit('completed', { statusCode: response.statusCode, unreplayable: response.unreplayable });
      } else if (!uncertain) {
        this.counters.count('lateCompletions', route.handler);
        events?.emit('lease_takeover', {});
        this.logger.warn(
          `${route.handler}: the claim was gone when the handler finished (its lease ran out, or the key was deleted or evicted); ` +
            'its response was not saved',
        );
      }
    } catch (error) {
      this.counters.count('storeErrors', route.handler);
      events?.emit('store_error', { operation: 'complete', error });
      const message = `${route.handler}: could not save the response (${(error as Error).message}); trying again until the lease ends`;
      // After a failed claim (fail-open) the outage was logged already; the save may have no claim to complete.
      if (uncertain) this.logger.debug(message);
      else this.logger.error(message);
      void this.saveLater(storageKey, token, response, route, leaseEndsAt, uncertain, events);
    }
  }

  private async saveLater(
    storageKey: string,
    token: string,
    response: SavedResponse,
    route: GuardedRoute,
    leaseEndsAt: number,
    uncertain: boolean,
    events: CallEvents | undefined,
  ) {
    for (let delayMs = 100; Date.now() + delayMs < leaseEndsAt; delayMs = Math.min(delayMs * 2, 2000)) {
      await new Promise((resolve) => setTimeout(resolve, delayMs).unref());
      try {
        // false: a late copy of an earlier save (or of the claim's release) landed meanwhile.
        if (await this.store.complete(storageKey, token, response, route.expireMs)) {
          events?.emit('completed', { statusCode: response.statusCode, unreplayable: response.unreplayable });
          this.logger.log(`${route.handler}: saved the response on a later try`);
        }
        return;
      } catch (error) {
        this.counters.count('storeErrors', route.handler);
        events?.emit('store_error', { operation: 'complete', error });
      }
    }
    const message = `${route.handler}: gave up saving the response; the key frees when its lease ends`;
    if (uncertain) this.logger.debug(message);
    else this.logger.error(message);
  }

  private async release(storageKey: string, token: string, handler: string, events: CallEvents | undefined): Promise<void> {
    try {
      if (await this.timed('release', events, () => this.store.release(storageKey, token))) {
        this.counters.count('released', handler);
        events?.emit('released', {});
      }
    } catch (error) {
      this.counters.count('storeErrors', handler);
      events?.emit('store_error', { operation: 'release', error });
      this.logger.error(`Could not release an idempotency key (it frees when its lease ends): ${(error as Error).message}`);
    }
  }

  /** Runs a store call, timed as a `store_call` event when the call is listened to (else the call's own promise). */
  timed<T>(operation: StoreOperation, events: CallEvents | undefined, call: () => Promise<T>): Promise<T> {
    return events ? this.timedFor(events, operation, call) : call();
  }

  private async timedFor<T>(events: CallEvents, operation: StoreOperation, call: () => Promise<T>): Promise<T> {
    const started = performance.now();
    try {
      return await call();
    } finally {
      events.emit('store_call', { operation, durationMs: performance.now() - started });
    }
  }
}
