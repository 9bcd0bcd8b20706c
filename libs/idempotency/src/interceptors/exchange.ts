import type { CallHandler } from '@nestjs/common';
import type { Observable } from 'rxjs';
import type { FingerprintInput } from '../keys/fingerprint.js';
import type { SavedResponse } from '../stores/idempotency-store.js';

/** Why the guard does not run the handler: each transport answers these its own way. */
export type GuardRefusal =
  | { reason: 'user_unresolved' }
  | { reason: 'key_invalid'; problem: string }
  | { reason: 'payload_unsupported'; problem: string }
  | { reason: 'key_missing'; source: string }
  | { reason: 'in_progress'; retryAfterMs: number }
  | { reason: 'key_reused' }
  /** `shuttingDown`: the store is fine, this instance is going away (the client goes to another). */
  | { reason: 'store_unavailable'; shuttingDown?: true };

/**
 * A claim the guard holds (or may hold: a claim that failed may still land) for one run, proven
 * by its claim token.
 */
export interface HeldClaim {
  /** Saves the answer for replay (fenced by the claim token); never rejects. */
  save(response: SavedResponse): Promise<void>;
  /** Frees the key for a retry (compare-and-delete); never rejects. */
  release(): Promise<void>;
  /**
   * How long the run may keep the claim, in milliseconds: the longest a handler is listened to
   * after its caller went away (an outer timeout), so that its answer is still saved.
   */
  holdMs: number;
  /** Aborted when the claim is lost while the handler runs (`@LeaseSignal()` hands it over; made when first read). */
  readonly signal: AbortSignal;
}

/**
 * One guarded call as its transport sees it (an HTTP request, an RPC message): what its
 * fingerprint hashes, how the handler runs while the claim is held, how a saved answer is
 * replayed, and how a refusal is answered.
 */
export interface GuardExchange {
  /**
   * The handler segment of the call's storage key, where the call's route is narrower than its
   * handler (a message handler of several patterns: the handler and the pattern). Absent: the
   * route's handler.
   */
  keyHandler?(): string;
  /**
   * What the fingerprint hashes: the route, its parameters, query and body; or the message. A
   * promise when the transport must wait for part of it (HTTP: an uploaded file on disk).
   * Throws (or rejects with) `IdempotencyError` for a call that cannot be fingerprinted.
   */
  fingerprintInput(): FingerprintInput | Promise<FingerprintInput>;
  /**
   * Runs the handler while holding the claim: saves its answer, or releases the key if it fails
   * (HTTP under `saveStatuses`: saves the answer to a failure of the method itself, by status).
   */
  run(next: CallHandler, claim: HeldClaim): Observable<unknown>;
  /** Answers a duplicate with the saved answer. */
  replay(saved: SavedResponse): Observable<unknown>;
  /** Answers a refusal: throws the transport's error, or (RPC events) completes without a value. */
  refuse(refusal: GuardRefusal): Observable<unknown>;
  /**
   * The call runs while the app shuts down (the drain waits for it) instead of being refused: an
   * event whose refusal nobody settles, which its transport acknowledges all the same (NATS
   * core, Redis, TCP, MQTT): refused, it was lost. Absent: refused, so that the client goes elsewhere.
   */
  readonly runsWhileClosing?: boolean;
}
