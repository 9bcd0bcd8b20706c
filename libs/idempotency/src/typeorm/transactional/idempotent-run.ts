// The seam of a transactional run: what the caller names (`IdempotentRunInput`), what its work
// answers (`IdempotentAnswer`) and what the run did (`IdempotentRunResult`). Expected outcomes are
// values, as the store's `ClaimResult` is; only the work's own errors and the database's throw.

/** Which operation a run is: its key, and optionally what the operation was asked to do. */
export interface IdempotentRunInput {
  /**
   * The storage key, as it is (keys of any length work: `recordKey`). It shares the table with
   * the guard's `no_repeat:...` keys: give it a namespace of its own, e.g. `payments:<user>:<client key>`.
   */
  key: string;
  /** The request's fingerprint (at most 128 characters), compared on duplicates; '' or absent: not compared. */
  fingerprint?: string;
}

/** What the work answers: saved with its writes, replayed to duplicates. */
export interface IdempotentAnswer<T> {
  /** Default 200. */
  statusCode?: number;
  /** A JSON-able value, saved as JSON text; `undefined`: no body. */
  body: T;
}

/**
 * What `run` did. `body` is the answer's JSON form (`JSON.parse` of the saved text: the work's
 * body through `serialize`, or by default `JSON.stringify` keeping of each class instance without
 * `toJSON` what class-transformer's `instanceToPlain` keeps; a Date becomes its ISO string) both
 * when the work ran and when it is replayed, so the two look alike.
 */
export type IdempotentRunResult<T> =
  /** The work ran; its writes and the answer committed together. */
  | { status: 'ran'; statusCode: number; body: T }
  /** A committed answer of this key, in its retention; the work did not run. */
  | { status: 'replayed'; statusCode: number; body: T }
  /** Another transaction (or a store claim) holds the key; try again after `retryAfterMs`. */
  | { status: 'in_progress'; retryAfterMs: number }
  /** The key was used with another fingerprint. */
  | { status: 'mismatch' };
