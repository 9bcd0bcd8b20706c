import {
  IdempotencyStore,
  type ClaimInput,
  type ClaimResult,
  type SavedResponse,
  type SettleWatch,
  type StoredRecord,
} from '../idempotency-store.js';
import { SettleWatchers } from '../settle-watchers.js';

interface Entry {
  state: 'processing' | 'completed';
  token: string;
  fingerprint: string;
  response?: SavedResponse;
  /** Epoch milliseconds. */
  expiresAt: number;
}

export interface MemoryIdempotencyStoreOptions {
  /** Most entries kept; the oldest are dropped beyond it. Default 100,000. */
  maxEntries?: number;
}

/**
 * In-process store with the same semantics as the Redis store. One process only: two instances
 * of an app each have their own, so duplicates that reach different instances both run.
 * Bounded: past `maxEntries` expired entries go first, then the oldest.
 */
export class MemoryIdempotencyStore extends IdempotencyStore {
  private readonly entries = new Map<string, Entry>();
  private readonly watchers = new SettleWatchers();
  readonly maxEntries: number;

  constructor(options: MemoryIdempotencyStoreOptions = {}) {
    super();
    this.maxEntries = options.maxEntries ?? 100_000;
    if (!(this.maxEntries >= 1)) throw new RangeError('maxEntries must be at least 1');
  }

  get size(): number {
    return this.entries.size;
  }

  async claim({ key, token, fingerprint, leaseMs }: ClaimInput): Promise<ClaimResult> {
    const now = Date.now();
    const entry = this.live(key, now);
    if (!entry) {
      this.insert(key, { state: 'processing', token, fingerprint, expiresAt: now + leaseMs }, now);
      return { status: 'acquired', token };
    }
    if (fingerprint !== '' && entry.fingerprint !== '' && entry.fingerprint !== fingerprint) {
      return { status: 'mismatch' };
    }
    if (entry.state === 'completed') return { status: 'completed', response: entry.response! };
    return { status: 'in_progress', retryAfterMs: entry.expiresAt - now };
  }

  async complete(key: string, token: string, response: SavedResponse, ttlMs: number): Promise<boolean> {
    const now = Date.now();
    const entry = this.live(key, now);
    if (entry?.state !== 'processing' || entry.token !== token) return false;
    entry.state = 'completed';
    entry.response = response;
    entry.expiresAt = now + ttlMs;
    this.watchers.notify(key);
    return true;
  }

  async release(key: string, token: string): Promise<boolean> {
    const entry = this.live(key, Date.now());
    if (entry?.state !== 'processing' || entry.token !== token) return false;
    this.entries.delete(key);
    this.watchers.notify(key);
    return true;
  }

  override async watch(key: string): Promise<SettleWatch> {
    return this.watchers.watch(key);
  }

  async get(key: string): Promise<StoredRecord | undefined> {
    const now = Date.now();
    const entry = this.live(key, now);
    if (!entry) return undefined;
    const { state, token, fingerprint, response } = entry;
    return { state, token, fingerprint, response, ttlMs: entry.expiresAt - now };
  }

  private live(key: string, now: number): Entry | undefined {
    const entry = this.entries.get(key);
    if (entry && entry.expiresAt <= now) {
      this.entries.delete(key);
      return undefined;
    }
    return entry;
  }

  private insert(key: string, entry: Entry, now: number): void {
    if (this.entries.size >= this.maxEntries) this.evict(now);
    this.entries.set(key, entry);
  }

  /** Drops expired entries from the oldest end, then the oldest live one if still full. */
  private evict(now: number): void {
    const scanLimit = 64;
    let scanned = 0;
    for (const [key, entry] of this.entries) {
      if (this.entries.size < this.maxEntries || scanned++ >= scanLimit) break;
      if (entry.expiresAt <= now) this.entries.delete(key);
    }
    if (this.entries.size >= this.maxEntries) {
      this.entries.delete(this.entries.keys().next().value!);
    }
  }
}
