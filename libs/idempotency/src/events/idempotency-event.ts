import type { UnreplayableReason } from '../stores/idempotency-store.js';

/** The transport of a guarded call. */
export type IdempotencyTransport = 'http' | 'rpc';

/** What every event says about the call it reports. Durations in milliseconds, by the monotonic clock. */
export interface IdempotencyEventBase {
  /** `Controller.method`: the key's handler segment (bounded by the routes, fit for a metric label). */
  handler: string;
  transport: IdempotencyTransport;
  /**
   * The user segment of the storage key, as stored (percent-encoded): the user id, `ip:<address>`
   * for an anonymous caller under `anonymous: 'address'`, `anon:` for the shared anonymous
   * namespace, `''` for a message.
   */
  user: string;
  /**
   * SHA-256 (hex) of the storage key `<keyPrefix>:<user>:<handler>:<key>`. It ties together the
   * events of one key, across calls and instances, without carrying the client key (up to 255
   * characters, and it may be a business value such as an order number or an e-mail address).
   * Who has the key finds its events with `sha256(buildStorageKey(...))`.
   */
  keyHash: string;
  /** Since the guard began on this call (before its claim). */
  elapsedMs: number;
}

/** The claim was won: the handler runs now. */
export interface IdempotencyAcquiredEvent extends IdempotencyEventBase {
  type: 'acquired';
}

/** The answer was saved for replay (also after a fail-open run whose claim landed late, or on a later try). */
export interface IdempotencyCompletedEvent extends IdempotencyEventBase {
  type: 'completed';
  /**
   * From the claim won to the answer ready to save: the handler, then the app's interceptors,
   * serializers and exception filters that shaped the answer the client got.
   */
  handlerMs: number;
  /** The saved status (0 for a message handler's result). */
  statusCode: number;
  /** Set when the handler succeeded but its answer is not kept: duplicates get 409 `IDEMPOTENCY_RESPONSE_NOT_REPLAYABLE`. */
  unreplayable?: UnreplayableReason;
}

/**
 * A duplicate answered from the saved record (or, when `unreplayable` is set, 409
 * `IDEMPOTENCY_RESPONSE_NOT_REPLAYABLE`). Not for a caller gone before the answer.
 */
export interface IdempotencyReplayedEvent extends IdempotencyEventBase {
  type: 'replayed';
  statusCode: number;
  unreplayable?: UnreplayableReason;
}

/**
 * A duplicate found the key held by a call still running. `waiting: false`: it was answered 409
 * `IDEMPOTENCY_IN_PROGRESS`. `waiting: true`: it now waits for the first result
 * (`waitForResultMs`), and another event of this call tells how the wait ended (`replayed`;
 * `acquired` when the first call failed; `in_progress` with `waiting: false` at the bound). When
 * the caller left during the wait (an outer timeout), a `replayed` or `in_progress` that would
 * answer it is not reported (nor counted): nobody is answered.
 */
export interface IdempotencyInProgressEvent extends IdempotencyEventBase {
  type: 'in_progress';
  /** The holder's lease left, at most: when a retry may find the key settled. */
  retryAfterMs: number;
  waiting: boolean;
}

/** The key was used before with another payload: answered 422 `IDEMPOTENCY_KEY_REUSED`. */
export interface IdempotencyKeyReusedEvent extends IdempotencyEventBase {
  type: 'key_reused';
}

/**
 * The claim was freed unused, so a retry runs the handler: the handler failed, its answer to an
 * error is not saved, or the caller went away before it ran.
 */
export interface IdempotencyReleasedEvent extends IdempotencyEventBase {
  type: 'released';
  /** From the claim won to the release (about 0 when the caller went away before the handler ran). */
  handlerMs: number;
}

/** The answer could not be saved: the lease had run out and another call may have taken the key over. */
export interface IdempotencyLeaseTakeoverEvent extends IdempotencyEventBase {
  type: 'lease_takeover';
  handlerMs: number;
}

/** The claim was renewed while the handler runs (every third of the lease). */
export interface IdempotencyRenewedEvent extends IdempotencyEventBase {
  type: 'renewed';
}

/**
 * The claim was lost while the handler runs (a renewal refused, renewals failing until the lease
 * ended, or `maxHoldSeconds` passed): a retry may run the handler again. `@LeaseSignal()` aborts.
 */
export interface IdempotencyLeaseLostEvent extends IdempotencyEventBase {
  type: 'lease_lost';
  reason: string;
}

/** A store call failed (each failure, retries included). */
export interface IdempotencyStoreErrorEvent extends IdempotencyEventBase {
  type: 'store_error';
  /** `wait`: watching the key for the first result (`waitForResultMs`). */
  operation: 'claim' | 'wait' | 'complete' | 'release' | 'renew';
  /**
   * What the store failed with, described: a new `Error` with the store error's `name`, its
   * `code` (else its cause's: `ECONNREFUSED`, a PostgreSQL SQLSTATE), its `message` with the
   * storage key replaced by `keyHash`, and its stack's frames. Never the error itself, its `cause`
   * nor a driver's fields (command arguments, query parameters): those hold the client key, the
   * saved answer and the claim token, and a listener may write the event out.
   */
  error: Error & { code?: string };
}

/**
 * The claim failed and the route fails open: the handler runs unguarded (a `store_error` came
 * first). Reported as the handler starts: not when the caller left during the claim (an outer
 * timeout), when no handler runs.
 */
export interface IdempotencyFailOpenEvent extends IdempotencyEventBase {
  type: 'fail_open';
}

/**
 * The app is shutting down (its drain has begun): the call was refused, 503
 * `IDEMPOTENCY_STORE_UNAVAILABLE` with `Retry-After: 1` (a message as a fail-closed route refuses
 * one), so that its client goes to another instance. Reported as the caller gets the refusal.
 */
export interface IdempotencyShuttingDownEvent extends IdempotencyEventBase {
  type: 'shutting_down';
}

/** One timed store call of the request path, failed or not (the metric `store_duration_seconds`). */
export interface IdempotencyStoreCallEvent extends IdempotencyEventBase {
  type: 'store_call';
  operation: 'claim' | 'complete' | 'release' | 'renew';
  durationMs: number;
}

/** What the guard reports, one event per decision or effect; `type` tells which. */
export type IdempotencyEvent =
  | IdempotencyAcquiredEvent
  | IdempotencyCompletedEvent
  | IdempotencyReplayedEvent
  | IdempotencyInProgressEvent
  | IdempotencyKeyReusedEvent
  | IdempotencyReleasedEvent
  | IdempotencyLeaseTakeoverEvent
  | IdempotencyRenewedEvent
  | IdempotencyLeaseLostEvent
  | IdempotencyStoreErrorEvent
  | IdempotencyFailOpenEvent
  | IdempotencyShuttingDownEvent
  | IdempotencyStoreCallEvent;

export type IdempotencyEventType = IdempotencyEvent['type'];

/**
 * Receives the guard's events, synchronously on the request path: keep it quick (hand slow work
 * to a queue). What it throws or rejects is logged, once per listener and event type, and never
 * changes the answer.
 */
export type IdempotencyEventListener = (event: IdempotencyEvent) => void | Promise<void>;
