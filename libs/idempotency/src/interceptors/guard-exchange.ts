import type { Observable } from 'rxjs';
import type { KeyOwner } from '../keys/storage-key.js';
import type { SavedResponse } from '../stores/idempotency-store.js';

/** Why the guard does not run the handler: each transport answers these its own way. */
export type GuardRefusal =
  | { reason: 'key_missing'; source: string }
  | { reason: 'in_progress'; retryAfterMs: number }
  | { reason: 'key_reused' }
  | { reason: 'store_unavailable' };

/**
 * One guarded call as its transport sees it (an HTTP request, an RPC message): what identifies
 * it, how a saved answer is replayed, and how a refusal is answered.
 */
export interface GuardExchange {
  /** The request fingerprint (method, route, query, body; or the message). */
  readonly fingerprint: string;
  /** Whose record it is. */
  readonly owner: KeyOwner;
  /** The client's key, or undefined when it sent none. */
  readonly clientKey: string | undefined;
  /** The saved answer, as the handler's value to send again. */
  replay(saved: SavedResponse): unknown;
  /** The handler's answer to save, or null when it cannot be replayed (the key is released). */
  capture(value: unknown): SavedResponse | null;
  /** Answers a refusal: throws the transport's error, or (RPC events) completes without a value. */
  refuse(refusal: GuardRefusal): Observable<unknown>;
}

/** The handler's value as JSON text: undefined for no value, null when JSON cannot hold it. */
export function serialize(value: unknown): string | undefined | null {
  if (value === undefined) return undefined;
  try {
    return JSON.stringify(value);
  } catch {
    return null; // BigInt, cycles
  }
}

/** The saved JSON text as the value again. */
export const deserialize = (saved: SavedResponse): unknown =>
  saved.body === undefined ? undefined : JSON.parse(saved.body);
