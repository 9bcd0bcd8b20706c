import type { CallHandler } from '@nestjs/common';
import type { Observable } from 'rxjs';
import type { KeyOwner } from '../keys/storage-key.js';
import type { SavedResponse } from '../stores/idempotency-store.js';

/** Why the guard does not run the handler: each transport answers these its own way. */
export type GuardRefusal =
  | { reason: 'key_missing'; source: string }
  | { reason: 'in_progress'; retryAfterMs: number }
  | { reason: 'key_reused' }
  | { reason: 'store_unavailable' };

/** A key the guard holds (or may hold: a claim that failed may still land) for one run. */
export interface OwnedKey {
  /** Saves the answer for replay (fenced by the owner token); never rejects. */
  save(response: SavedResponse): Promise<void>;
  /** Frees the key for a retry (compare-and-delete); never rejects. */
  release(): Promise<void>;
  /** How long the claim holds, in milliseconds. */
  leaseMs: number;
}

/**
 * One guarded call as its transport sees it (an HTTP request, an RPC message): what identifies
 * it, how the handler runs while the key is held, how a saved answer is replayed, and how a
 * refusal is answered.
 */
export interface GuardExchange {
  /** The request fingerprint (method, route, query, body; or the message). */
  readonly fingerprint: string;
  /** Whose record it is. */
  readonly owner: KeyOwner;
  /** The client's key, or undefined when it sent none. */
  readonly clientKey: string | undefined;
  /** Runs the handler while holding the key: saves its answer, or releases the key if it fails. */
  run(next: CallHandler, owned: OwnedKey): Observable<unknown>;
  /** Answers a duplicate with the saved answer. */
  replay(saved: SavedResponse): Observable<unknown>;
  /** Answers a refusal: throws the transport's error, or (RPC events) completes without a value. */
  refuse(refusal: GuardRefusal): Observable<unknown>;
}
