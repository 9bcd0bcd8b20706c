import { IdempotencyStoreError } from '../../errors/idempotency.errors.js';
import {
  IdempotencyStore,
  type ClaimInput,
  type ClaimResult,
  type ForgetResult,
  type SavedResponse,
  type SettleWatch,
  type StoredRecord,
} from '../idempotency-store.js';
import { entryBytes } from '../local-cache/completed-records.js';
import { SettleWatchers } from '../settle-watchers.js';
import { ExpiryHeap } from './expiry-heap.js';

/** The `performance` read last, and what is added to its `now()`: see `monotonicNow`. */
let clockSource: { now(): number } | undefined;
let clockOffset = 0;
let lastNow = 0;
/** The offset each `performance` had, so that real time that passed while another was read counts. */
const offsets = new WeakMap<object, number>();

/**
 * Milliseconds by the monotonic clock: a stepped wall clock (NTP, a resumed VM, `date -s`) moves
 * no lease or retention. The global `performance`, so that fake timers move it in tests. Fake
 * timers put another `performance` in its place, whose clock starts at 0: each one keeps the
 * offset it was given, so the real clock's time goes on counting while fake timers are on, and
 * the clock never goes back (an offset is raised to the last reading when it would).
 */
function monotonicNow(): number {
  const source = globalThis.performance;
  if (source !== clockSource) {
    const raw = source.now();
    const known = offsets.get(source);
    clockOffset = known !== undefined && known + raw >= lastNow ? known : lastNow - raw;
    offsets.set(source, clockOffset);
    clockSource = source;
  }
  return (lastNow = clockOffset + source.now());
}
// Read once as the module loads: the `performance` of that moment (the real one, unless fake
// timers are on) keeps its offset from now on, and its time counts while fake timers are on.
monotonicNow();

interface Entry {
  key: string;
  state: 'processing' | 'completed';
  token: string;
  fingerprint: string;
  response?: SavedResponse;
  /** By the monotonic clock (`monotonicNow`), never the wall clock. */
  expiresAt: number;
  /** What it counts against `maxBytes` (`entryBytes`). */
  bytes: number;
}

/** A claim's record: no answer yet. */
const NO_ANSWER: SavedResponse = { statusCode: 0, headers: {} };

export interface MemoryIdempotencyStoreOptions {
  /**
   * Most records held. Expired records make room first; when every record is live, a claim of a
   * new key fails with `IdempotencyStoreError` (the route's outage policy applies). Default 100,000.
   */
  maxEntries?: number;
  /**
   * Most bytes its records hold (keys, fingerprints, saved bodies and headers, as the local
   * cache counts them). Expired records make room first; an answer that would go past it is kept
   * without its body and headers (its duplicates get 409 `IDEMPOTENCY_RESPONSE_NOT_REPLAYABLE`,
   * never a second run), and a claim that would go past it fails as a full store. Default 64 MiB.
   */
  maxBytes?: number;
}

/**
 * In-process store with the same semantics as the Redis store. One process only: two instances
 * of an app each have their own, so duplicates that reach different instances both run.
 *
 * Bounded by `maxEntries` and `maxBytes`, and it never drops a live record (a claim in progress,
 * or a response within its retention): expired records go as soon as a claim passes them, and
 * when it is full of live records, a claim of a new key throws `IdempotencyStoreError` ("memory
 * store full") rather than forget a key whose duplicate would then run again; an answer that
 * would go past `maxBytes` is kept without its body and headers (not replayable). Claims of keys
 * it holds still answer as usual. Expiry order is kept in a min-heap, so a claim costs O(log n).
 */
export class MemoryIdempotencyStore extends IdempotencyStore {
  private readonly entries = new Map<string, Entry>();
  /**
   * Every entry by expiry, soonest first. A slot is stale, and skipped, when its entry is no
   * longer the map's (released, expired and read, claimed again) or has another expiry since
   * (completed, renewed): stale slots are never taken for live entries.
   */
  private readonly expiries = new ExpiryHeap<Entry>();
  private readonly watchers = new SettleWatchers();
  readonly maxEntries: number;
  readonly maxBytes: number;
  private held = 0;

  constructor(options: MemoryIdempotencyStoreOptions = {}) {
    super();
    this.maxEntries = options.maxEntries ?? 100_000;
    this.maxBytes = options.maxBytes ?? 64 * 1024 * 1024;
    if (!(this.maxEntries >= 1)) throw new RangeError('maxEntries must be at least 1');
    if (!(this.maxBytes >= 1)) throw new RangeError('maxBytes must be at least 1');
  }

  get size(): number {
    return this.entries.size;
  }

  /** The bytes its records hold, as `maxBytes` counts them. */
  get bytes(): number {
    return this.held;
  }

  async claim({ key, token, fingerprint, leaseMs }: ClaimInput): Promise<ClaimResult> {
    const now = monotonicNow();
    const entry = this.live(key, now);
    if (!entry) {
      this.insert({ key, state: 'processing', token, fingerprint, expiresAt: now + leaseMs, bytes: entryBytes(key, { fingerprint, response: NO_ANSWER }) }, now);
      return { status: 'acquired', token };
    }
    if (fingerprint !== '' && entry.fingerprint !== '' && entry.fingerprint !== fingerprint) {
      return { status: 'mismatch' };
    }
    if (entry.state === 'completed') return { status: 'completed', response: entry.response! };
    // Whole milliseconds: a float difference of the clock's readings came out past the lease (3000.0000000000005).
    return { status: 'in_progress', retryAfterMs: Math.round(entry.expiresAt - now) };
  }

  async complete(key: string, token: string, response: SavedResponse, retentionMs: number): Promise<boolean> {
    const now = monotonicNow();
    const entry = this.live(key, now);
    if (entry?.state !== 'processing' || entry.token !== token) return false;
    let bytes = entryBytes(key, { fingerprint: entry.fingerprint, response });
    if (this.held - entry.bytes + bytes > this.maxBytes) {
      this.dropExpired(now);
      if (this.held - entry.bytes + bytes > this.maxBytes) {
        // Kept, so that no duplicate runs again, without the body and headers that would not fit
        // (an answer that grew nothing past its claim cannot get here).
        response = { statusCode: response.statusCode, headers: {}, unreplayable: 'too_large' };
        bytes = entryBytes(key, { fingerprint: entry.fingerprint, response });
      }
    }
    this.held += bytes - entry.bytes;
    entry.bytes = bytes;
    entry.state = 'completed';
    entry.response = response;
    entry.expiresAt = now + retentionMs;
    this.schedule(entry);
    this.watchers.notify(key);
    return true;
  }

  async release(key: string, token: string): Promise<boolean> {
    const entry = this.live(key, monotonicNow());
    if (entry?.state !== 'processing' || entry.token !== token) return false;
    this.remove(entry);
    this.watchers.notify(key);
    return true;
  }

  async renew(key: string, token: string, leaseMs: number): Promise<boolean> {
    const now = monotonicNow();
    const entry = this.live(key, now);
    if (entry?.state !== 'processing' || entry.token !== token) return false;
    const expiresAt = now + leaseMs;
    if (expiresAt !== entry.expiresAt) {
      // The slot of the old expiry goes stale (its time no longer matches), so the heap never
      // drops the renewed claim at its first lease's end.
      entry.expiresAt = expiresAt;
      this.schedule(entry);
    }
    return true;
  }

  override async forget(key: string): Promise<ForgetResult> {
    const entry = this.live(key, monotonicNow());
    if (!entry) return { forgotten: false, reason: 'absent' };
    if (entry.state !== 'completed') return { forgotten: false, reason: 'in_progress' };
    // Its heap slot goes stale (the map no longer holds this entry), as after a release.
    this.remove(entry);
    return { forgotten: true };
  }

  override async watch(key: string): Promise<SettleWatch> {
    return this.watchers.watch(key);
  }

  async get(key: string): Promise<StoredRecord | undefined> {
    const now = monotonicNow();
    const entry = this.live(key, now);
    if (!entry) return undefined;
    const { state, token, fingerprint, response } = entry;
    return { state, token, fingerprint, response, ttlMs: entry.expiresAt - now };
  }

  private live(key: string, now: number): Entry | undefined {
    const entry = this.entries.get(key);
    if (entry && entry.expiresAt <= now) {
      this.remove(entry);
      return undefined;
    }
    return entry;
  }

  private remove(entry: Entry): void {
    this.entries.delete(entry.key);
    this.held -= entry.bytes;
  }

  /** Adds a record for a key it does not hold; throws when every record it holds is live. */
  private insert(entry: Entry, now: number): void {
    this.dropExpired(now);
    if (this.entries.size >= this.maxEntries) {
      throw new IdempotencyStoreError(
        `memory store full: ${this.entries.size} live records; raise memoryMaxEntries or use Redis`,
      );
    }
    if (this.held + entry.bytes > this.maxBytes) {
      throw new IdempotencyStoreError(
        `memory store full: its live records hold ${this.held} bytes, and this claim needs ${entry.bytes} bytes; raise memoryMaxBytes or use Redis`,
      );
    }
    this.entries.set(entry.key, entry);
    this.held += entry.bytes;
    this.schedule(entry);
  }

  /** Gives the entry a heap slot for its (new) expiry. */
  private schedule(entry: Entry): void {
    this.expiries.push(entry, entry.expiresAt);
    // Stale slots pile up when keys are released, completed or renewed: rebuild the heap from
    // the map once they outnumber the entries (O(n) after at least n pushes, so O(1) per push).
    if (this.expiries.length > 2 * this.entries.size + 1024) {
      this.expiries.rebuild(this.entries.values(), (live) => live.expiresAt);
    }
  }

  /** Pops stale slots and expired entries off the top of the heap, deleting the expired ones. */
  private dropExpired(now: number): void {
    for (let top = this.expiries.peek(); top !== undefined; top = this.expiries.peek()) {
      const at = this.expiries.peekTime();
      const current = this.entries.get(top.key) === top && top.expiresAt === at;
      if (current && at > now) return;
      this.expiries.pop();
      if (current) this.remove(top);
    }
  }
}
