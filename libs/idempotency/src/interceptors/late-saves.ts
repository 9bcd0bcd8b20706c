import type { Logger } from '@nestjs/common';
import { performance } from 'node:perf_hooks';
import type { CallEvents } from '../events/call-events.js';
import type { IdempotencyCounters } from '../metrics/idempotency-counters.js';
import type { IdempotencyStore, SavedResponse } from '../stores/idempotency-store.js';
import { entryBytes } from '../stores/local-cache/completed-records.js';
import type { OutageLog } from './outage-log.js';
import type { GuardedRoute } from './route-options.js';

/** A failed save, waiting for the store to answer again. */
export interface LateSave {
  storageKey: string;
  token: string;
  response: SavedResponse;
  route: GuardedRoute;
  /** Given up at this time of the monotonic clock (`performance.now()`): the lease's end; for a fail-open run, `maxHoldSeconds` from the claim. */
  until: number;
  /** A fail-open run's: its claim may never have landed, and its giving up is not an error. */
  uncertain: boolean;
  events: CallEvents | undefined;
}

/** At most this many saves wait, holding at most this much memory (as V8 keeps their strings): an outage under load must not grow the heap without end. */
export const LATE_SAVES_MAX_ENTRIES = 10_000;
export const LATE_SAVES_MAX_BYTES = 64 * 1024 * 1024;
/** The probe of the store: soon, then backing off to every 2 s while it fails (a third of the shortest lease waiting, if less). */
const FIRST_PROBE_MS = 100;
const PROBE_MAX_MS = 2000;
/** The longest a shutdown waits for the store to take the kept saves. */
const FLUSH_MS = 2000;

/**
 * The failed saves on a store that `deliversLate`, kept until their lease ends, or, for a
 * fail-open run whose claim may still land, until `maxHoldSeconds` (see `StoreCalls.save`).
 * While the store is down one probe (`ping`) goes out at a time for all of them: each save tried
 * on its own would leave a copy of its response in the client's offline queue at every try. Once
 * a probe is answered, every save is tried, in one batch: a client that sends late sends them
 * after what it kept (the claims), so each lands after its claim; one that fails waits for the
 * next probe. Bounded in entries and bytes; a save that does not fit, or whose time ends, is
 * given up. The probes come at least every third of the shortest lease waiting: a late claim
 * holds its key one lease from when it lands, and a save after that is refused.
 */
export class LateSaves {
  private readonly pending = new Map<LateSave, number>();
  private bytes = 0;
  private timer?: NodeJS.Timeout;
  private delayMs = FIRST_PROBE_MS;

  constructor(
    private readonly store: IdempotencyStore,
    private readonly counters: IdempotencyCounters,
    private readonly outageLog: OutageLog,
    private readonly logger: Logger,
  ) {}

  /** Keeps `save` until the store answers; false when it does not fit (given up). */
  add(save: LateSave): boolean {
    const bytes = entryBytes(save.storageKey, { fingerprint: save.token, response: save.response });
    if (this.pending.size >= LATE_SAVES_MAX_ENTRIES || this.bytes + bytes > LATE_SAVES_MAX_BYTES) return false;
    this.pending.set(save, bytes);
    this.bytes += bytes;
    if (!this.timer) this.schedule();
    return true;
  }

  /**
   * At shutdown: every kept save is tried once more now (the store may answer), and what is left
   * is given up, with a warning: the timers would not keep the process alive for them. Never rejects.
   */
  async flush(): Promise<void> {
    if (this.pending.size === 0) return;
    clearTimeout(this.timer);
    this.timer = undefined;
    this.delayMs = FIRST_PROBE_MS;
    let timer: NodeJS.Timeout | undefined;
    const late = new Promise<never>((_resolve, reject) => {
      timer = setTimeout(() => reject(new Error('no answer')), FLUSH_MS).unref();
    });
    try {
      this.dropExpired();
      // Bounded: a shutdown must not wait for a store that does not answer.
      await Promise.race([this.store.ping(), late]);
      await Promise.race([Promise.all([...this.pending.keys()].map((save) => this.tryOnce(save))), late]);
    } catch {
      // the store does not answer: what is kept is given up below
    } finally {
      clearTimeout(timer);
    }
    const left = [...this.pending.keys()].filter((save) => !save.uncertain).length;
    if (left > 0) this.logger.warn(`${left} response(s) kept while the store did not answer could not be saved before shutdown; their keys free when their leases end`);
    this.pending.clear();
    this.bytes = 0;
  }

  /** How many saves wait. */
  get size(): number {
    return this.pending.size;
  }

  private schedule(): void {
    this.timer = setTimeout(() => void this.probe(), this.delayMs);
    this.timer.unref();
  }

  /** Never rejects, and always schedules the next probe while saves wait (a throwing store or logger left them waiting for ever). */
  private async probe(): Promise<void> {
    try {
      this.dropExpired();
      if (this.pending.size === 0) return;
      let answered = true;
      try {
        await this.store.ping();
      } catch {
        answered = false;
      }
      if (answered) {
        const saved = await Promise.all([...this.pending.keys()].map((save) => this.tryOnce(save)));
        const count = saved.filter(Boolean).length;
        if (count > 0) this.logger.log(`saved ${count} responses kept while the store did not answer`);
      }
    } catch (error) {
      this.logger.error(`kept responses: ${(error as Error).message}`);
    } finally {
      this.next();
    }
  }

  private next(): void {
    if (this.pending.size === 0) {
      this.timer = undefined;
      this.delayMs = FIRST_PROBE_MS;
      return;
    }
    let shortestLeaseMs = Infinity;
    for (const save of this.pending.keys()) shortestLeaseMs = Math.min(shortestLeaseMs, save.route.leaseMs);
    this.delayMs = Math.min(this.delayMs * 2, PROBE_MAX_MS, Math.max(shortestLeaseMs / 3, FIRST_PROBE_MS));
    this.schedule();
  }

  /** One try, true when it saved; a save the store answered (saved, or refused: no claim of its token) is done. */
  private async tryOnce(save: LateSave): Promise<boolean> {
    try {
      const saved = await this.store.complete(save.storageKey, save.token, save.response, save.route.expireMs);
      this.remove(save);
      if (saved) save.events?.emit('completed', { statusCode: save.response.statusCode, unreplayable: save.response.unreplayable });
      return saved;
    } catch (error) {
      this.counters.count('storeErrors', save.route.handler);
      save.events?.emit('store_error', { operation: 'complete', error });
      return false;
    }
  }

  private dropExpired(): void {
    const now = performance.now();
    for (const save of this.pending.keys()) {
      if (save.until > now) continue;
      this.remove(save); // a fail-open run's claim never landed, or holds the key one lease past it
      if (save.uncertain) continue;
      this.outageLog.warn(
        'late-saves:gave-up',
        `${save.route.handler}: gave up saving the response; the key frees when its lease ends`,
        'responses not saved',
      );
    }
  }

  private remove(save: LateSave): void {
    const bytes = this.pending.get(save);
    if (bytes === undefined) return;
    this.pending.delete(save);
    this.bytes -= bytes;
  }
}
