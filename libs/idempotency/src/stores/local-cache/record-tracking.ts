import type { SavedResponse } from '../idempotency-store.js';

/** A completed record as a tracked read found it. */
export interface TrackedRecord {
  /** The fingerprint the record was claimed with ('' when not compared). */
  fingerprint: string;
  /** The saved answer. */
  response: SavedResponse;
  /** Retention left when the store read it, in milliseconds. */
  ttlMs: number;
}

/** What the local cache hears from its tracking. */
export interface TrackingListener {
  /** These keys changed, were deleted or expired in the store: their entries are stale. */
  invalidated(keys: readonly string[]): void;
  /** Every entry is suspect: a connection dropped (its tracking went with it) or the store was flushed. */
  reset(): void;
}

/**
 * How the local cache learns that a record it holds changed in the store, on any instance
 * (server-assisted client-side caching). After `read` returns a record, every later change of
 * its key is announced to the listener, for as long as `live` stays true; when tracking is lost,
 * the listener is `reset` first.
 */
export interface RecordTracking {
  /** True while changes of the keys read through `read` are announced. */
  readonly live: boolean;
  /** Starts listening; never rejects (tracking that cannot start yet keeps `live` false and retries). */
  start(listener: TrackingListener): Promise<void>;
  /**
   * Reads the completed record of `key` and tracks the key from that read on. Undefined when
   * `key` holds no completed record, or one without a retention.
   */
  read(key: string): Promise<TrackedRecord | undefined>;
  /**
   * Resolves once every instance listening has heard the changes made before the call (a forget
   * on this instance), or after a bound; never rejects. Without it, an instance that hears an
   * invalidation late answers from its cache meanwhile.
   */
  heardEverywhere(): Promise<void>;
  /** Stops listening and closes its connections. */
  stop(): Promise<void>;
}
