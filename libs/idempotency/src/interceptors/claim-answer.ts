import { type CallHandler, type ExecutionContext } from '@nestjs/common';
import { Observable, defer } from 'rxjs';
import { rememberLeaseSignal } from '../decorators/lease-signal.decorator.js';
import type { CallEvents } from '../events/call-events.js';
import { IdempotencyCounters } from '../metrics/idempotency-counters.js';
import { IdempotencyStore, type ClaimInput, type ClaimResult } from '../stores/idempotency-store.js';
import { isUnmatchable, UNMATCHABLE_RETRY } from '../keys/fingerprint.js';
import { awaitSettled } from './await-settled.js';
import type { GuardExchange, GuardRefusal, HeldClaim } from './exchange.js';
import type { GuardedRoute } from './route-options.js';
import { StoreCalls } from './store-calls.js';

/** What answers a guarded call; `release` frees a claim it holds, unused. */
export interface Guarded {
  result: Observable<unknown>;
  release?: () => Promise<void>;
}

/**
 * The answer `answer` makes, made when the caller subscribes, and `decided` (what counts and
 * reports the decision) called then: never for a caller gone first, who is not answered.
 */
function answered(decided: () => void, answer: () => Observable<unknown>): Observable<unknown> {
  return defer(() => {
    decided();
    return answer();
  });
}

/**
 * The last step of the request path: claims the storage key (waiting for the first result where
 * the route says so) and answers by what the store holds: run the handler holding the claim,
 * replay, refuse; or, when the store fails, the route's outage policy.
 */
export class ClaimAnswers {
  constructor(
    private readonly store: IdempotencyStore,
    private readonly counters: IdempotencyCounters,
    /** The module's, shared by every guard it builds (a request-scoped subclass is built per request). */
    private readonly calls: StoreCalls,
  ) {
    this.pushes = store.watch !== IdempotencyStore.prototype.watch;
  }

  /** The store pushes settlements (`watch`: memory, Redis), rather than being looked at again every 100 ms. */
  private readonly pushes: boolean;

  async answer(
    ctx: ExecutionContext,
    exchange: GuardExchange,
    next: CallHandler,
    route: GuardedRoute,
    input: ClaimInput,
    events: CallEvents | undefined,
  ): Promise<Guarded> {
    // The app is shutting down: no run starts here (see `StoreCalls.shutsOut`).
    if (this.calls.shutsOut(exchange)) return this.refuseShuttingDown(route, exchange, events);
    // A claim in flight is waited for by a shutdown (until decided: a run held, or its key freed).
    const early = this.calls.claimStarted();
    try {
      let claim: ClaimResult;
      try {
        claim = await this.calls.timed('claim', events, () => this.store.claim(input));
        // A default wait (an event's) only where the store pushes settlements: on one that does not
        // (PostgreSQL), each waiting copy looked again every 100 ms on the pool the handlers and
        // the guard share, held renewals and saves back, and every key ran 3 times (a helper).
        if (claim.status === 'in_progress' && route.waitForResultMs > 0 && (this.pushes || !route.waitsByDefault)) {
          this.counters.count('waited', route.handler);
          events?.emit('in_progress', { retryAfterMs: claim.retryAfterMs, waiting: true });
          claim = await awaitSettled(this.store, input, claim, route.waitForResultMs, (error) => {
            this.counters.count('storeErrors', route.handler);
            events?.emit('store_error', { operation: 'wait', error });
            // Once per route every 10 s with a count, as outages are: each waiting request logged it (a helper: 90 lines a stall).
            this.calls.outageLog.warn(
              `${route.handler}:wait`,
              `${route.handler}: cannot wait for the first result: ${(error as Error).message}; waiting on`,
              'waits met a store failure',
            );
          });
        }
      } catch (error) {
        return this.storeFailed(ctx, exchange, next, route, input, events, error, early);
      }
      // A decision that only answers the caller is counted and reported as the caller gets it: not
      // for a caller gone meanwhile (an outer timeout during the claim or the wait).
      switch (claim.status) {
        case 'in_progress': {
          const { retryAfterMs } = claim;
          const refused = () => {
            this.counters.count('inProgress', route.handler);
            events?.emit('in_progress', { retryAfterMs, waiting: false });
          };
          return { result: answered(refused, () => exchange.refuse({ reason: 'in_progress', retryAfterMs })) };
        }
        case 'mismatch': {
          const refused = () => {
            this.counters.count('mismatched', route.handler);
            events?.emit('key_reused', {});
          };
          // A call whose body's bytes are lost may be the retry of the one that ran: not "reused".
          const refusal: GuardRefusal = isUnmatchable(input.fingerprint)
            ? { reason: 'payload_unsupported', problem: UNMATCHABLE_RETRY }
            : { reason: 'key_reused' };
          return { result: answered(refused, () => exchange.refuse(refusal)) };
        }
        case 'completed': {
          const { response } = claim;
          const replayed = () => {
            this.counters.count('replayed', route.handler);
            events?.emit('replayed', { statusCode: response.statusCode, unreplayable: response.unreplayable });
          };
          return { result: answered(replayed, () => exchange.replay(response)) };
        }
        case 'acquired':
          // Answered as the drain began: freed, and refused, as any call from then on (but an
          // event nobody settles whose claim was sent while the drain took events).
          if (this.calls.shutsOut(exchange, true)) return this.refuseClosing(route, input, exchange, events);
          this.counters.count('acquired', route.handler);
          events?.emit('acquired', {});
          return runHolding(ctx, exchange, next, route, this.calls.hold(input, route, false, events, early));
      }
    } finally {
      this.calls.claimDecided(early);
    }
  }

  /** A claim taken (or perhaps taken) as the app began to shut down: freed, and the call refused. */
  private refuseClosing(route: GuardedRoute, input: ClaimInput, exchange: GuardExchange, events: CallEvents | undefined): Guarded {
    this.calls.retry(this.calls.release(input.key, input.token, route.handler, events));
    return this.refuseShuttingDown(route, exchange, events);
  }

  /** The app is shutting down: 503, so that the client goes to another instance; counted and reported as the caller gets it. */
  private refuseShuttingDown(route: GuardedRoute, exchange: GuardExchange, events: CallEvents | undefined): Guarded {
    const refused = () => {
      this.counters.count('shuttingDown', route.handler);
      events?.emit('shutting_down', {});
    };
    return { result: answered(refused, () => exchange.refuse({ reason: 'store_unavailable', shuttingDown: true })) };
  }

  /** The store failed the claim: 503 for a fail-closed route, else the handler runs unguarded. */
  private storeFailed(
    ctx: ExecutionContext,
    exchange: GuardExchange,
    next: CallHandler,
    route: GuardedRoute,
    input: ClaimInput,
    events: CallEvents | undefined,
    error: unknown,
    /** The claim was sent before the shutdown began (`StoreCalls.claimStarted`). */
    early: boolean,
  ): Guarded {
    this.counters.count('storeErrors', route.handler);
    events?.emit('store_error', { operation: 'claim', error });
    const message = `${route.handler}: idempotency store unavailable, ${(error as Error).message}`;
    if (route.failMode === 'closed') {
      this.calls.outageLog.warn(`${route.handler}:refused`, `${message}; refusing`, 'requests refused');
      // A claim that timed out may still land (a slow store): free it, or it would hold the key
      // for a lease with no handler running. On one connection the release goes after the claim.
      // Housekeeping for a call already answered: no event, and its failure is the outage's.
      this.store.release(input.key, input.token).catch(() => undefined);
      return { result: defer(() => exchange.refuse({ reason: 'store_unavailable' })) };
    }
    if (this.calls.shutsOut(exchange, true)) return this.refuseClosing(route, input, exchange, events);
    // A claim that timed out may still land when the store recovers: run as its possible
    // holder, so that the answer completes it or a failure releases it, never a stranded key.
    const possible = this.calls.hold(input, route, true, events, early);
    const { result } = runHolding(ctx, exchange, next, route, possible);
    const failOpen = () => {
      this.counters.count('failOpen', route.handler);
      events?.emit('fail_open', {});
      this.calls.outageLog.warn(`${route.handler}:unguarded`, `${message}; running unguarded`, 'requests ran unguarded');
    };
    const release = () => {
      this.calls.outageLog.warn(`${route.handler}:left`, `${message}; the caller left before the handler ran`, 'callers left before the handler ran');
      return possible.release();
    };
    return { result: answered(failOpen, () => result), release };
  }
}

function runHolding(ctx: ExecutionContext, exchange: GuardExchange, next: CallHandler, route: GuardedRoute, claim: HeldClaim): Guarded {
  if (route.takesLeaseSignal) rememberLeaseSignal(ctx, claim);
  return { result: exchange.run(next, claim), release: () => claim.release() };
}
