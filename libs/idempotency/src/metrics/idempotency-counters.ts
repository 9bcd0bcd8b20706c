import { Injectable } from '@nestjs/common';

/** What the guard decided, counted since start; one instance per application (module provider). */
@Injectable()
export class IdempotencyCounters {
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
  /** Completions refused because the lease had run out (another request may have run). */
  lateCompletions = 0;
  /** Store calls that failed. */
  storeErrors = 0;
  /** Requests run unguarded because the store was down (fail-open). */
  failOpen = 0;
}
