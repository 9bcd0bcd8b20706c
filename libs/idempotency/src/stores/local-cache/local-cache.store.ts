import { Logger } from '@nestjs/common';
import { setImmediate } from 'node:timers';
import {
  IdempotencyStore,
  type ClaimInput,
  type ClaimResult,
  type ForgetResult,
  type SavedResponse,
  type SettleWatch,
  type StoredRecord,
} from '../idempotency-store.js';
import { CompletedRecords, type CachedRecord } from './completed-records.js';
import type { LocalCacheBounds } from './local-cache-options.js';
import type { RecordTracking, TrackingListener } from './record-tracking.js';

/** A tracked read on its way: an invalidation of its key meanwhile makes its answer stale. */
interface Fill {
  stale: boolean;
}

/** Nest's lifecycle hooks, forwarded to the wrapped store (Nest calls them on the provider only). */
const HOOKS = ['onModuleInit', 'onApplicationBootstrap', 'onModuleDestroy', 'beforeApplicationShutdown', 'onApplicationShutdown'] as const;
type Hooks = Partial<Record<(typeof HOOKS)[number], (signal?: string) => unknown>>;

/**
 * A store in front of another that keeps the completed records this process has replayed, so
 * that replaying them again costs no round trip (`IdempotencyModule.forRoot({ localCache })`). A
 * completed record never changes until it expires, unless it is forgotten, deleted or flushed;
 * `tracking` announces those, from every instance.
 *
 * An entry comes from a claim that found the record completed (a replay), never from this
 * process's own completion: a first request costs what it costs without the cache, and the
 * entries are the records that are replayed, not every record saved. It is filled off the
 * request path by a tracked read of the record: from that read on, any change of the key is
 * announced, and a change announced while the read is on its way discards its answer. An entry
 * expires by the monotonic clock no later than the record: at the retention the read found,
 * counted from before the read (the global `performance.now()`, which fake timers move too).
 * While tracking is not live (a connection is down), nothing is cached and every call goes to
 * the store. Everything else is the wrapped store's. Built by `IdempotencyModule` for
 * `localCache`; exported for `instanceof`, `store` and `cacheStats()`.
 */
export class LocalCacheIdempotencyStore extends IdempotencyStore implements TrackingListener {
  private readonly logger = new Logger('IdempotencyLocalCache');
  private readonly records: CompletedRecords;
  private readonly fills = new Map<string, Fill>();

  constructor(
    /** The store behind the cache. */
    readonly store: IdempotencyStore,
    private readonly tracking: RecordTracking,
    bounds: LocalCacheBounds,
  ) {
    super();
    this.records = new CompletedRecords(bounds.maxEntries, bounds.maxBytes);
  }
  override get deliversLate(): boolean {
    return this.store.deliversLate;
  }


  /** Entries held, their size in bytes as counted against `maxBytes`, and whether tracking is live. */
  cacheStats(): { entries: number; bytes: number; live: boolean } {
    return { entries: this.records.size, bytes: this.records.bytes, live: this.tracking.live };
  }

  /**
   * A cached record answers without a round trip, but not in the same turn: the answer waits for
   * the event loop's check phase (`setImmediate`), so that the replays of one poll are answered
   * together, as answers from Redis are. Answering each in its socket's read callback measured
   * ~40 µs more CPU per replay on Fastify and ~55 µs on Express (bench/README.md), and a bare
   * Nest endpoint shows the same. The entry is looked up again then: an invalidation read in
   * that poll (a forget on another instance, announced before the request came) drops it, and
   * the claim goes to the store. Answering with the entry found first replayed a forgotten
   * record after the operator's forget had returned (an adversarial helper: 1-7 of 160 answers,
   * under load).
   */
  async claim(input: ClaimInput): Promise<ClaimResult> {
    if (this.records.get(input.key, performance.now()) !== undefined) {
      await checkPhase();
      const cached = this.records.get(input.key, performance.now());
      if (cached !== undefined) return answerOf(cached, input.fingerprint);
    }
    const result = await this.store.claim(input);
    if (result.status === 'completed') this.fill(input.key, input.fingerprint, result.response);
    return result;
  }

  complete(key: string, token: string, response: SavedResponse, retentionMs: number): Promise<boolean> {
    return this.store.complete(key, token, response, retentionMs);
  }

  release(key: string, token: string): Promise<boolean> {
    return this.store.release(key, token);
  }

  renew(key: string, token: string, leaseMs: number, sent?: () => void): Promise<boolean> {
    return this.store.renew(key, token, leaseMs, sent);
  }

  get(key: string): Promise<StoredRecord | undefined> {
    return this.store.get(key);
  }

  /**
   * Forgets here at once (also a read on its way), then in the store; other instances hear it
   * from their tracking, and a forget returns once they have (at most ~2 s): a retry sent the
   * moment it returns, to an instance that heard the invalidation late, replayed the forgotten
   * answer (an adversarial helper: ~1.5 % of immediate retries under load).
   */
  override async forget(key: string): Promise<ForgetResult> {
    this.invalidated([key]);
    try {
      const result = await this.store.forget(key);
      if (result.forgotten) await this.tracking.heardEverywhere();
      return result;
    } finally {
      this.invalidated([key]);
    }
  }

  override ping(): Promise<void> {
    return this.store.ping();
  }

  override watch(key: string): Promise<SettleWatch> {
    return this.store.watch(key);
  }

  invalidated(keys: readonly string[]): void {
    for (const key of keys) {
      this.records.delete(key);
      const fill = this.fills.get(key);
      if (fill !== undefined) fill.stale = true;
    }
  }

  reset(): void {
    this.records.clear();
    for (const fill of this.fills.values()) fill.stale = true;
    this.fills.clear();
  }

  async onModuleInit(): Promise<void> {
    await (this.store as Hooks).onModuleInit?.();
    await this.tracking.start(this);
  }

  async onApplicationBootstrap(): Promise<void> {
    await (this.store as Hooks).onApplicationBootstrap?.();
  }

  async onModuleDestroy(): Promise<void> {
    await (this.store as Hooks).onModuleDestroy?.();
  }

  async beforeApplicationShutdown(signal?: string): Promise<void> {
    await (this.store as Hooks).beforeApplicationShutdown?.(signal);
  }

  async onApplicationShutdown(signal?: string): Promise<void> {
    await this.tracking.stop();
    this.reset();
    await (this.store as Hooks).onApplicationShutdown?.(signal);
  }

  /**
   * Reads the record, tracked, off the request path, and keeps it unless it changed meanwhile or
   * is not the one the claim found (its answer `found`, a fingerprint the claim's matched): the
   * reader may read another db than the store for a moment (a client switched by `SELECT`), and
   * what it tracks is what it read.
   */
  private fill(key: string, fingerprint: string, found: SavedResponse): void {
    // A record too large to keep is not read again for nothing at each of its replays.
    if (!this.tracking.live || this.fills.has(key) || !this.records.fits(key, { fingerprint, response: found })) return;
    const fill: Fill = { stale: false };
    this.fills.set(key, fill);
    const sentAt = performance.now();
    const done = () => {
      if (this.fills.get(key) === fill) this.fills.delete(key);
    };
    this.tracking.read(key).then(
      (read) => {
        done();
        if (fill.stale || read === undefined || !sameResponse(read.response, found)) return;
        if (fingerprint !== '' && read.fingerprint !== '' && read.fingerprint !== fingerprint) return;
        this.records.set(key, { fingerprint: read.fingerprint, response: read.response, expiresAt: sentAt + read.ttlMs });
      },
      (error: unknown) => {
        done();
        // The store answered the call itself; only the cache missed an entry.
        this.logger.debug(`could not read ${key} for the local cache: ${(error as Error).message}`);
      },
    );
  }
}

/** The same saved answer: status, headers, body and its encoding, or the same reason it cannot be replayed. */
function sameResponse(a: SavedResponse, b: SavedResponse): boolean {
  if (a.statusCode !== b.statusCode || a.body !== b.body || a.encoding !== b.encoding || a.unreplayable !== b.unreplayable) return false;
  const names = Object.keys(a.headers);
  return names.length === Object.keys(b.headers).length && names.every((name) => a.headers[name] === b.headers[name]);
}

/** The coming check phase, shared by the hits of one turn. */
let nextCheck: Promise<void> | undefined;

/**
 * Resolves in the event loop's check phase: one `setImmediate` for every hit of the turn. Node's
 * own `setImmediate`, never a fake timer's (Jest's replace the global one): a hit stands in for a
 * round trip, which fake timers do not hold either, and an Immediate they dropped unrun would
 * hold every later hit.
 */
function checkPhase(): Promise<void> {
  return (nextCheck ??= new Promise((resolve) =>
    setImmediate(() => {
      nextCheck = undefined;
      resolve();
    }),
  ));
}

/** What a claim of a completed record answers, as the store would: the fingerprint check first. */
function answerOf(cached: CachedRecord, fingerprint: string): ClaimResult {
  if (fingerprint !== '' && cached.fingerprint !== '' && cached.fingerprint !== fingerprint) return { status: 'mismatch' };
  return { status: 'completed', response: cached.response };
}
