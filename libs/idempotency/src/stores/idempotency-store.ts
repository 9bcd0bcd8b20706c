import { IdempotencyError } from '../errors/idempotency.errors.js';

/** A response saved by the first request and replayed to its duplicates. */
export interface SavedResponse {
  /** HTTP status code (or 0 for RPC handlers). */
  statusCode: number;
  /** Allowlisted response headers, lower-case names. Never request headers or cookies. */
  headers: Record<string, string>;
  /**
   * The body the first client received: its bytes as UTF-8 text, or as base64 when `encoding`
   * says so (bytes that are not UTF-8, or hold a NUL). For RPC handlers, the result as JSON text.
   * Absent when there was no body.
   */
  body?: string;
  /** `base64` when `body` holds base64 of the bytes; absent for UTF-8 text. */
  encoding?: 'base64';
  /**
   * Set when the handler ran to success but its answer was not kept for replay: a duplicate then
   * gets 409 `IDEMPOTENCY_RESPONSE_NOT_REPLAYABLE`, never a second run. `too_large`: the body
   * was over `maxResponseBytes`; `not_delivered`: the first client got another answer (an outer
   * timeout answered before the handler settled); `server_error`: the app answered 5xx after
   * the handler succeeded; `not_serializable`: a message handler's result JSON cannot hold (a
   * BigInt, an object that refers to itself, a Buffer, a stream); `partial`: the answer was to
   * the first request's Range or precondition headers (a 206, 416 or 412).
   */
  unreplayable?: UnreplayableReason;
}

/** Why a completed record holds no replayable answer (see `SavedResponse.unreplayable`). */
export type UnreplayableReason = 'too_large' | 'not_delivered' | 'server_error' | 'not_serializable' | 'partial';

/** What a claim found; expected outcomes are values, not exceptions. */
export type ClaimResult =
  /** The caller owns the key until `leaseMs` runs out (`renew` extends it); complete or release with `token`. */
  | { status: 'acquired'; token: string }
  /** Another request holds the key; it frees or completes it within `retryAfterMs`. */
  | { status: 'in_progress'; retryAfterMs: number }
  /** The first request completed; replay its response. */
  | { status: 'completed'; response: SavedResponse }
  /** The key was claimed with another request fingerprint (same key, other payload). */
  | { status: 'mismatch' };

export interface ClaimInput {
  key: string;
  /** Fingerprint of the request payload, compared on duplicates ('' to skip the check). */
  fingerprint: string;
  /** Owner token: unique per attempt. */
  token: string;
  /** How long the claim holds while the handler runs, in milliseconds. */
  leaseMs: number;
  /**
   * The caller is watching the key (see `watch`) and will wait if it is in progress: the store
   * then notifies watchers when the holder completes or releases it.
   */
  wait?: boolean;
}

/** A registration for the settlement of one key; `cancel` it when done waiting. */
export interface SettleWatch {
  /** Resolves when the key may have settled (completed or released); never rejects. */
  settled: Promise<void>;
  cancel(): void;
}

/** Re-check interval of stores that cannot push settlement (the default `watch`). */
export const SETTLE_POLL_MS = 100;

/** A record as the store holds it, for tooling and tests. */
export interface StoredRecord {
  state: 'processing' | 'completed';
  token: string;
  fingerprint: string;
  response?: SavedResponse;
  /** Milliseconds until the record expires (-1 when it has no expiry). */
  ttlMs: number;
}

/**
 * What `forget` did. Only a completed record is forgotten; a claim in progress is refused, since
 * deleting it would let a duplicate run beside the live handler. `not_a_record`: the key holds
 * something else (in a store whose keyspace the app shares, as Redis), left as it was.
 */
export type ForgetResult = { forgotten: true } | { forgotten: false; reason: 'absent' | 'in_progress' | 'not_a_record' };

/**
 * The seam between the guard and its storage, and its DI token. Every method is atomic and one
 * round trip; every store passes the shared contract suite (`describeStoreContract`).
 */
export abstract class IdempotencyStore {
  /** Claims `key` if free (or if its lease ran out); otherwise says what holds it. */
  abstract claim(input: ClaimInput): Promise<ClaimResult>;

  /**
   * Saves `response` and keeps it `retentionMs`, only while `token` still owns a processing
   * claim. Returns false when the lease ran out or another claim took the key.
   */
  abstract complete(key: string, token: string, response: SavedResponse, retentionMs: number): Promise<boolean>;

  /**
   * Saves `response` for `token`'s processing claim whose lease ran out, while nobody has claimed
   * the key since: the store still holds that claim, expired, with its token. The guard asks it
   * of a save `complete` refused for landing after the lease (a busy pool's queue). Default
   * false: a store that drops an expired claim (Redis, the memory store) cannot tell it from a
   * key another request took, completed, and an operator forgot.
   */
  async completeAfterLease(_key: string, _token: string, _response: SavedResponse, _retentionMs: number): Promise<boolean> {
    return false;
  }

  /** Deletes the claim only while `token` still owns it (compare-and-delete). */
  abstract release(key: string, token: string): Promise<boolean>;

  /**
   * Extends the live processing claim that `token` holds so that it ends `leaseMs` from now (by
   * the store's clock). False when the token holds no live processing claim of `key` (it was
   * completed, released, taken over or expired): the caller has lost the lease.
   *
   * `sent`, when given, is called when the renewal goes out to the store's server (for a pooled
   * store: once the pool handed it a connection; called again if it goes out again): the guard
   * counts the new lease from then. A store that never calls it has its renewals' leases counted
   * from when the guard asked, which is early by any wait before the call went out: a renewal
   * that waited for a busy pool then took the claim for lost while the store still held it.
   */
  abstract renew(key: string, token: string, leaseMs: number, sent?: () => void): Promise<boolean>;

  /**
   * Reads a record without changing it (tooling, tests). Throws `IdempotencyNotARecordError`
   * when the key holds something that is no record (a store whose keyspace the app shares).
   */
  abstract get(key: string): Promise<StoredRecord | undefined>;

  /**
   * Deletes the record of `key` only if it is a live COMPLETED record, so that the next claim of
   * the key runs the handler again (an operator's tool: `IdempotencyAdmin.forget`). A processing
   * claim is refused (`in_progress`) and left as it was; no record (or an expired one) is
   * `absent`; a value that is no record (a store whose keyspace the app shares) is
   * `not_a_record`, and left as it was. Atomic like every write: a check and a delete in one step, so a claim that takes
   * the key meanwhile is never deleted. Every built-in store implements it; this default throws,
   * so that a store written before it existed still compiles and says what it lacks.
   */
  async forget(_key: string): Promise<ForgetResult> {
    throw new IdempotencyError(`${this.constructor.name} cannot forget a record: implement IdempotencyStore.forget(key)`);
  }

  /**
   * Whether a call that failed may still reach the store later: a client that keeps commands
   * while the store is away and sends them once it is back (ioredis's offline queue, its sending
   * again of commands a dropped connection left unanswered). The guard then keeps trying a
   * fail-open run's save up to `maxHoldSeconds`, so that a claim that lands after the run settled
   * is completed, not left processing with nothing to finish it. Default false: a failed call is over.
   */
  get deliversLate(): boolean {
    return false;
  }

  /** Checks the store answers (health checks); throws when it does not. Default: one read. */
  async ping(): Promise<void> {
    await this.get('health:ping');
  }

  /**
   * Watches `key` for its settlement, for duplicates that wait for the first result instead of
   * a 409. Register the watch first, then claim with `wait: true`, then await `settled`: a
   * settlement between the claim and the wait is not missed. This default resolves after
   * `SETTLE_POLL_MS` (bounded re-checks); the memory and Redis stores push instead.
   */
  async watch(_key: string): Promise<SettleWatch> {
    let timer: NodeJS.Timeout | undefined;
    const settled = new Promise<void>((resolve) => {
      timer = setTimeout(resolve, SETTLE_POLL_MS).unref();
    });
    return { settled, cancel: () => clearTimeout(timer) };
  }
}
