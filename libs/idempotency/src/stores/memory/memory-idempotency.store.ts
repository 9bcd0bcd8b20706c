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
  key: string;
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
 * Bounded: past `maxEntries` the oldest entries go (expired ones also go as soon as they are read).
 */
export class MemoryIdempotencyStore extends IdempotencyStore {
  private readonly entries = new Map<string, Entry>();
  /**
   * Entries in claim order, oldest at `head`, for eviction. A slot whose entry is no longer the
   * map's (released, expired, claimed again) is stale and skipped. Iterating the map itself
   * would walk past every slot deleted since it last compacted (~100 µs per insert once full),
   * and an iterator kept between evictions holds on to every table the map has outgrown.
   */
  private order: Entry[] = [];
  private head = 0;
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
      this.insert({ key, state: 'processing', token, fingerprint, expiresAt: now + leaseMs });
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

  private insert(entry: Entry): void {
    if (this.entries.size >= this.maxEntries) this.evict();
    this.entries.set(entry.key, entry);
    this.order.push(entry);
    // Stale slots pile up when keys are released or expire below the bound: rebuild the queue
    // from the map (which keeps claim order) once they outnumber the entries.
    if (this.order.length - this.head > 2 * this.entries.size + 1024) {
      this.order = [...this.entries.values()];
      this.head = 0;
    }
  }

  /** Drops the oldest entries (first claimed) until there is room. */
  private evict(): void {
    while (this.entries.size >= this.maxEntries && this.head < this.order.length) {
      const oldest = this.order[this.head++];
      if (this.entries.get(oldest.key) === oldest) this.entries.delete(oldest.key);
    }
    if (this.head > 1024 && this.head * 2 > this.order.length) {
      this.order = this.order.slice(this.head);
      this.head = 0;
    }
  }
}
