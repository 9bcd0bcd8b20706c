import { Injectable } from '@nestjs/common';

/** What the guard decided for one call, and what happened to the claims of running handlers. */
export type IdempotencyOutcome =
  | 'acquired'
  | 'replayed'
  | 'inProgress'
  | 'waited'
  | 'mismatched'
  | 'released'
  | 'lateCompletions'
  | 'storeErrors'
  | 'failOpen'
  | 'shuttingDown'
  | 'renewed'
  | 'leasesLost';

/** Where outcomes go besides the totals: Prometheus, when `metrics` is on (fed by the guard's events). */
export interface IdempotencyMetricsSink {
  count(outcome: IdempotencyOutcome, handler: string): void;
  /** Duration of one store call, in seconds. */
  observeStore(operation: 'claim' | 'complete' | 'release' | 'renew', seconds: number): void;
}

/**
 * What the guard decided, counted since start: totals here, and per handler in `sink` when one is
 * given. One instance per application (a module provider, which has no sink: the module's
 * Prometheus metrics listen to `IdempotencyEvents` instead, and so may your own).
 */
@Injectable()
export class IdempotencyCounters implements Record<IdempotencyOutcome, number> {
  /** Claims won: the handler ran. */
  acquired = 0;
  /** Duplicates answered with the saved response. */
  replayed = 0;
  /** Duplicates answered 409 while the first was processing. */
  inProgress = 0;
  /** Duplicates that waited for the first result (`waitForResultMs`). */
  waited = 0;
  /** Keys reused with another payload (422). */
  mismatched = 0;
  /** Claims released after an exception or an unsaveable response. */
  released = 0;
  /** Completions refused because the lease had run out: another request took the key over. */
  lateCompletions = 0;
  /** Store calls that failed. */
  storeErrors = 0;
  /** Requests run unguarded because the store was down (fail-open). */
  failOpen = 0;
  /** Calls refused because the app was shutting down (503, so that their clients go elsewhere). */
  shuttingDown = 0;
  /** Claims renewed while their handlers ran (a renewal every third of the lease). */
  renewed = 0;
  /** Claims lost while their handlers ran (a renewal refused, or failing until the lease ended). */
  leasesLost = 0;

  constructor(readonly sink?: IdempotencyMetricsSink) {}

  count(outcome: IdempotencyOutcome, handler: string): void {
    this[outcome]++;
    this.sink?.count(outcome, handler);
  }
}
