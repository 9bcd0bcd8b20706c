import type { Logger } from '@nestjs/common';
import { performance } from 'node:perf_hooks';
import type { CallEvents } from '../events/call-events.js';
import type { IdempotencyCounters } from '../metrics/idempotency-counters.js';
import { IdempotencyStore, type ClaimInput, type SavedResponse } from '../stores/idempotency-store.js';
import type { GuardExchange, HeldClaim } from './exchange.js';
import { LATE_SAVES_MAX_BYTES, LATE_SAVES_MAX_ENTRIES, LateSaves } from './late-saves.js';
import { LeaseRenewal, type LeaseRenewalHooks } from './lease-renewal.js';
import { OutageLog } from './outage-log.js';
import { RunList, type ListedRun } from './run-list.js';
import type { GuardedRoute } from './route-options.js';

type StoreOperation = 'claim' | 'complete' | 'release' | 'renew';

/** The signal of a claim that is never renewed (fail-open): nothing to lose. */
const NEVER_ABORTED = new AbortController().signal;

/**
 * The guard's calls to its store, timed when the call's events are listened to, with what each
 * result means for the key: counted, reported (`events`, undefined when nobody listens), logged,
 * and (for a failed save) tried again until the lease ends (on a store that keeps an expired
 * claim, `maxHoldSeconds` past it).
 */
export class StoreCalls {
  /** Failed saves on a store that `deliversLate`, waiting for it to answer again. */
  private readonly lateSaves: LateSaves;
  /** The outage's warnings, a line of a kind every 10 s at most. */
  readonly outageLog: OutageLog;
  /** The claims held by runs in flight, until saved, released or lost; a shutdown waits for them (`drain`). */
  private readonly running = new RunList<Hold>();
  /** Saves tried again in the background (`saveLater`). */
  private readonly retrying = new Set<Promise<void>>();
  /** The store keeps an expired claim with its token (`completeAfterLease`: PostgreSQL). */
  private readonly savesAfterLease: boolean;
  /** The shutdown's drain, once begun: from then on no new run starts here (see `shutsOut`). */
  private draining?: Promise<void>;

  constructor(
    readonly store: IdempotencyStore,
    readonly counters: IdempotencyCounters,
    readonly logger: Logger,
    /** `shutdownWaitSeconds`: how long the drain waits at most (undefined: each run's `maxHoldSeconds`). */
    private readonly shutdownWaitSeconds?: number,
  ) {
    this.outageLog = new OutageLog(logger);
    this.lateSaves = new LateSaves(store, counters, this.outageLog, logger);
    this.savesAfterLease = store.completeAfterLease !== IdempotencyStore.prototype.completeAfterLease;
  }

  /**
   * The claim this run holds, renewed while the handler runs; or, after a failed claim, the one
   * it may hold (`uncertain`: not renewed, the store is down).
   */
  hold(input: ClaimInput, route: GuardedRoute, uncertain: boolean, events: CallEvents | undefined, early: boolean): HeldClaim {
    events?.held();
    const hold = new Hold(this, input.key, input.token, route, uncertain, events);
    this.running.add(hold);
    if (this.draining && early) this.early.add(hold);
    return hold;
  }

  /** `hold` is settled (saved, released, or its claim lost): a shutdown waits for it no more. */
  settled(hold: Hold): void {
    if (!this.running.delete(hold)) return;
    this.early.delete(hold);
    this.wake();
  }

  /**
   * Claims sent and not yet decided (a wait for the first result included): a shutdown waits for
   * them too. One answered after the store closed could not free its key (a caller already
   * answered, an outer timeout's 408): the key held a lease, and a retry elsewhere got 409.
   */
  private claiming = 0;
  /** Of those, the ones sent before the shutdown began. */
  private earlyClaims = 0;
  /** Once the shutdown began: the runs of calls that came before it, until settled. */
  private readonly early = new Set<Hold>();
  /**
   * While the shutdown waits for the calls that came before it, events that nobody settles still
   * run (`GuardExchange.runsWhileClosing`); then they are refused too, so that a steady stream of
   * events cannot hold the shutdown for ever (an adversarial helper: as long as the stream).
   */
  private admitting = true;

  /** A claim is sent: whether before the shutdown began (pass it to `hold` and `claimDecided`). */
  claimStarted(): boolean {
    this.claiming++;
    const early = this.draining === undefined;
    if (early) this.earlyClaims++;
    return early;
  }

  /** A claim is decided: its run is held (`hold`), or its key freed or never taken. */
  claimDecided(early: boolean): void {
    this.claiming--;
    if (early) this.earlyClaims--;
    this.wake();
  }

  /**
   * The app is shutting down and `exchange`'s call starts no run here: it is refused (503
   * `IDEMPOTENCY_STORE_UNAVAILABLE`, `Retry-After: 1`; a message is refused as in an outage), so
   * that its client goes to another instance. Nest keeps the server open while the guard waits
   * for its runs, and a run begun meanwhile was not waited for: its store closed under it, and
   * another instance ran it again (an adversarial helper: 30 of 30 keys). Every call, but an
   * event nobody settles that came while the shutdown waits for the calls that came before it:
   * once its claim is sent (`claimed`), it runs whenever the claim is answered (a copy waiting
   * for a first run that fails, refused, was lost: an adversarial helper).
   */
  shutsOut(exchange: GuardExchange, claimed = false): boolean {
    return this.drained || (this.draining !== undefined && !(exchange.runsWhileClosing && (claimed || this.admitting)));
  }

  /** The drain is over (settled, or past `shutdownWaitSeconds`): nothing runs here any more, the store closes. */
  private drained = false;

  /** What the drain waits for, and its resolver. */
  private waiting?: { done: () => boolean; resolve: () => void };

  private wake(): void {
    const waiting = this.waiting;
    if (waiting?.done()) {
      this.waiting = undefined;
      waiting.resolve();
    }
  }

  private until(done: () => boolean): Promise<void> {
    if (done()) return Promise.resolve();
    return new Promise((resolve) => (this.waiting = { done, resolve }));
  }

  /**
   * At shutdown: from now on no run starts here (`shutsOut`); waits for the runs in flight to
   * settle (each at most until its claim is lost: its lease unrenewed, or `maxHoldSeconds`),
   * then for the saves they try again, and tries the kept saves of a store that delivers late
   * once more. One drain, however often it is asked for (`app.close()` twice, a signal and a
   * `close()`). Never rejects.
   */
  drain(): Promise<void> {
    return (this.draining ??= this.drainOnce());
  }

  private async drainOnce(): Promise<void> {
    const waiting = this.running.size + this.claiming;
    for (const hold of this.running) this.early.add(hold);
    if (waiting > 0) this.logger.log(`waiting for ${waiting} guarded call(s) in flight to settle before the app shuts down`);
    const settled = this.settleAll();
    if (this.shutdownWaitSeconds === undefined) await settled;
    else if (!(await settledWithin(settled, this.shutdownWaitSeconds * 1000))) this.leave();
    // Past the bound the wait for the calls before the shutdown may still be under way: events
    // that claimed while it took them would start runs nobody waits for (a reviewing helper).
    this.drained = true;
    await this.lateSaves.flush();
    this.outageLog.flushAll();
  }

  /**
   * Waits for the calls that came before the shutdown (and the events that joined meanwhile), then
   * refuses events too and waits for the runs left, then for the saves they try again.
   */
  private async settleAll(): Promise<void> {
    await this.until(() => this.early.size === 0 && this.earlyClaims === 0);
    this.admitting = false;
    // Nothing new joins from now on (each hold is made after a check of `shutsOut`); events whose
    // claims were sent while they were taken still run, counted in `claiming`.
    await this.until(() => this.running.size === 0 && this.claiming === 0);
    while (this.retrying.size > 0) await Promise.all(this.retrying);
  }

  /** `shutdownWaitSeconds` passed: says what the app closes without. */
  private leave(): void {
    const handlers = new Map<string, number>();
    for (const hold of this.running) handlers.set(hold.handler, (handlers.get(hold.handler) ?? 0) + 1);
    const runs = [...handlers].map(([handler, count]) => `${handler} ×${count}`).join(', ');
    const left = [
      this.running.size > 0 && `${this.running.size} guarded run(s) still in flight (${runs}): their keys stay claimed until their leases end, then a retry runs them again`,
      this.claiming > 0 && `${this.claiming} claim(s) unanswered: a key one takes frees when its lease ends`,
      this.retrying.size > 0 && `${this.retrying.size} save(s) still tried: those keys free when their leases end`,
    ].filter(Boolean);
    this.logger.error(`shutdownWaitSeconds (${this.shutdownWaitSeconds}) passed; the app closes with ${left.join('; and ')}`);
  }

  /**
   * Saves the answer. A save that fails is tried again in the background until `tryUntil` (the
   * lease's end; for a fail-open run on a store that `deliversLate`, `maxHoldSeconds`; on a store
   * that keeps an expired claim, `maxHoldSeconds` past it: see `saveAfterLease`): the effect
   * happened, and a key left processing would refuse retries, then run them again.
   */
  async save(
    storageKey: string,
    token: string,
    response: SavedResponse,
    route: GuardedRoute,
    tryUntil: number,
    uncertain: boolean,
    events: CallEvents | undefined,
    /** The run this save settles (see `settled`). */
    hold?: Hold,
  ) {
    // The save may go into the expired claim: a run that held a claim, and was not told it lost it.
    const afterLease = this.savesAfterLease && !uncertain && hold !== undefined && !(hold.lost && route.takesLeaseSignal);
    try {
      const saved =
        (await this.timed('complete', events, () => this.store.complete(storageKey, token, response, route.expireMs))) ||
        (afterLease && (await this.saveAfterLease(storageKey, token, response, route, events)));
      if (saved) events?.emit('completed', { statusCode: response.statusCode, unreplayable: response.unreplayable });
      else if (!uncertain) this.refused(route, events);
    } catch (error) {
      this.counters.count('storeErrors', route.handler);
      events?.emit('store_error', { operation: 'complete', error });
      // After a failed claim (fail-open) the outage was logged already; the save may have no claim to complete.
      if (!uncertain) this.logger.error(`${route.handler}: could not save the response (${(error as Error).message}); trying again`);
      // A client that sends failed calls later may still hold this save (with its body): tried
      // again on its own, each try left another copy in its queue while the store was down (an
      // adversarial helper: +2.7 MB/s at 57 runs/s). It waits with the others for one probe.
      if (!this.store.deliversLate) return this.retry(this.saveLater(storageKey, token, response, route, tryUntil, uncertain, events, afterLease));
      const until = performance.now() + (tryUntil - Date.now());
      if (this.lateSaves.add({ storageKey, token, response, route, until, uncertain, events })) return;
      this.outageLog.warn(
        'late-saves:full',
        `${route.handler}: could not keep the response to save once the store answers (${LATE_SAVES_MAX_ENTRIES.toLocaleString('en')} ` +
          `saves or ${LATE_SAVES_MAX_BYTES / 1024 / 1024} MiB kept already); a retry may run the handler again`,
        'responses not kept',
      );
    } finally {
      if (hold) this.settled(hold);
    }
  }

  /** The store refused the save: another request holds the key, or (a store that keeps no expired claim) the lease ran out. */
  private refused(route: GuardedRoute, events: CallEvents | undefined): void {
    this.counters.count('lateCompletions', route.handler);
    events?.emit('lease_takeover', {});
    this.logger.warn(
      `${route.handler}: the claim was gone when the handler finished (its lease ran out, or the key was deleted or evicted); ` +
        'its response was not saved',
    );
  }

  /**
   * A save the store refused because the claim's lease ran out before it landed (a busy pool's
   * queue, a slow store; not lost while a handler that listens for it ran: `@LeaseSignal()`),
   * saved when nobody has claimed the key since (`completeAfterLease`: the store still holds the
   * expired claim, with its token; PostgreSQL). Refused, the save left the key free, and a retry
   * ran the handler again (an adversarial helper: 100 of 100 keys, a pool of 2 the handlers
   * shared with the PostgreSQL store, a healthy database). Claiming the key again instead saved
   * over one another request had taken, completed, and an operator forgot (another helper).
   * Whether saved; rejects as the store does (the save is then tried again).
   */
  private async saveAfterLease(storageKey: string, token: string, response: SavedResponse, route: GuardedRoute, events: CallEvents | undefined): Promise<boolean> {
    if (!(await this.timed('complete', events, () => this.store.completeAfterLease(storageKey, token, response, route.expireMs)))) return false;
    this.outageLog.warn(
      `${route.handler}:saved-after-lease`,
      `${route.handler}: the response was saved after the claim's lease ran out (the store answered late: a busy pool?), ` +
        'nobody having claimed the key since; raise leaseSeconds or give the store connections of its own',
      'responses saved after their lease',
    );
    return true;
  }

  /** Keeps `saving` (a save or release that never rejects) until it ends, for `drain`. */
  retry(saving: Promise<void>): void {
    const kept = saving.catch(() => undefined);
    this.retrying.add(kept);
    void kept.then(() => this.retrying.delete(kept));
  }

  private async saveLater(
    storageKey: string,
    token: string,
    response: SavedResponse,
    route: GuardedRoute,
    tryUntil: number,
    uncertain: boolean,
    events: CallEvents | undefined,
    /** The save may go into the expired claim (`saveAfterLease`): tried up to `maxHoldSeconds` past the lease. */
    afterLease: boolean,
  ) {
    // Past the lease, a store that keeps the expired claim takes the save into it while it is the
    // run's (until a claim takes the key, or the purge): a save that timed out in a pool's queue
    // past the lease's end was never tried again, and a retry ran the handler again (an
    // adversarial helper: 6 of 10 keys). Bounded as the kept saves of a store that delivers late.
    const bytes = afterLease ? 300 + (response.body?.length ?? 0) : 0;
    const extended = afterLease && this.keepAfterLease(bytes);
    const until = extended ? Math.max(tryUntil, Date.now()) + route.maxHoldMs : tryUntil;
    try {
      // At shutdown, past the lease: given up (the drain waits for these saves, the store closes).
      for (let delayMs = 100; Date.now() + delayMs < (this.draining ? tryUntil : until); delayMs = Math.min(delayMs * 2, 2000)) {
        await new Promise((resolve) => setTimeout(resolve, delayMs).unref());
        try {
          // Past the lease only the expired claim can take it (`complete` would be refused).
          const saved =
            Date.now() < tryUntil
              ? (await this.store.complete(storageKey, token, response, route.expireMs)) ||
                (afterLease && (await this.saveAfterLease(storageKey, token, response, route, events)))
              : afterLease && (await this.saveAfterLease(storageKey, token, response, route, events));
          // Not saved: a late copy of an earlier save (or of the claim's release) landed meanwhile,
          // or another request took the key; the store cannot say which, so nothing is reported.
          if (saved) {
            events?.emit('completed', { statusCode: response.statusCode, unreplayable: response.unreplayable });
            if (!uncertain) this.logger.log(`${route.handler}: saved the response on a later try`);
          }
          return;
        } catch (error) {
          this.counters.count('storeErrors', route.handler);
          events?.emit('store_error', { operation: 'complete', error });
        }
      }
      if (!uncertain) this.logger.error(`${route.handler}: gave up saving the response; the key is free once its lease ends`);
    } finally {
      if (extended) this.keepAfterLease(-bytes);
    }
  }

  /** Saves kept past their lease (`saveLater`), and their bytes: bounded as `LateSaves` is. */
  private keptAfterLease = { saves: 0, bytes: 0 };

  /** Takes (`bytes` > 0) or gives back a place for a save kept past its lease; false when full. */
  private keepAfterLease(bytes: number): boolean {
    const kept = this.keptAfterLease;
    if (bytes > 0 && (kept.saves >= LATE_SAVES_MAX_ENTRIES || kept.bytes + bytes > LATE_SAVES_MAX_BYTES)) return false;
    kept.saves += Math.sign(bytes);
    kept.bytes += bytes;
    return true;
  }

  /** Frees the key (compare-and-delete), settling `hold` if given; never rejects. */
  async release(storageKey: string, token: string, handler: string, events: CallEvents | undefined, hold?: Hold): Promise<void> {
    try {
      if (await this.timed('release', events, () => this.store.release(storageKey, token))) {
        this.counters.count('released', handler);
        events?.emit('released', {});
      }
    } catch (error) {
      this.counters.count('storeErrors', handler);
      events?.emit('store_error', { operation: 'release', error });
      // Through the outage log: in a store outage every failed run's release fails, and a line
      // for each flooded the log at the rate of the traffic (an adversarial helper).
      this.outageLog.warn(
        `${handler}:release`,
        `${handler}: could not release an idempotency key (it frees when its lease ends): ${(error as Error).message}`,
        'keys not released',
      );
    } finally {
      if (hold) this.settled(hold);
    }
  }

  /** Runs a store call, timed as a `store_call` event when the call is listened to (else the call's own promise). */
  timed<T>(operation: StoreOperation, events: CallEvents | undefined, call: () => Promise<T>): Promise<T> {
    return events ? this.timedFor(events, operation, call) : call();
  }

  private async timedFor<T>(events: CallEvents, operation: StoreOperation, call: () => Promise<T>): Promise<T> {
    const started = performance.now();
    try {
      return await call();
    } finally {
      events.emit('store_call', { operation, durationMs: performance.now() - started });
    }
  }
}

/** A held claim: its renewal while the handler runs, and the save or release that settles it. One object per call, no closures. */
class Hold implements HeldClaim, ListedRun<Hold> {
  readonly holdMs: number;
  // StoreCalls' list of runs in flight (`RunList`).
  previousRun?: Hold = undefined;
  nextRun?: Hold = undefined;
  listed = false;
  /**
   * The claim was lost while the handler ran (`lease_lost`). Where the handler was told
   * (`@LeaseSignal()` aborted), its answer, refused, is not saved under a new claim: it may be
   * what it answers once it stopped (an aborted run).
   */
  lost = false;
  private readonly renewal: LeaseRenewal;

  constructor(
    private readonly calls: StoreCalls,
    private readonly storageKey: string,
    private readonly token: string,
    private readonly route: GuardedRoute,
    private readonly uncertain: boolean,
    private readonly events: CallEvents | undefined,
  ) {
    const hooks = new RenewalHooks(calls, this, storageKey, token, route, events);
    // A fail-open run's claim may have landed (its answer lost in the outage): renewed too, so
    // that once the store is back it holds the key while the handler runs. Left to expire after
    // one lease, it let a duplicate that came (and waited) once Redis was healthy run beside the
    // first, every key of a burst (an adversarial helper). Quiet until a renewal says it landed.
    // Renewed until the handler settles, not only for one lease: it may land after a long outage.
    this.uncertainHooks = uncertain ? new UncertainRenewalHooks(hooks) : undefined;
    this.renewal = new LeaseRenewal(route.leaseMs, route.maxHoldMs, this.uncertainHooks ?? hooks, uncertain);
    this.holdMs = route.maxHoldMs;
  }

  /** `Controller.method`, for the drain's log. */
  get handler(): string {
    return this.route.handler;
  }

  private readonly uncertainHooks: UncertainRenewalHooks | undefined;

  /** Read only by `@LeaseSignal()`: the renewal makes its AbortController then. A fail-open run's never aborts: it holds no claim it knows of. */
  get signal(): AbortSignal {
    return this.uncertainHooks ? NEVER_ABORTED : this.renewal.signal;
  }

  save(response: SavedResponse): Promise<void> {
    this.events?.settled(); // handlerMs: the answer is ready; the save's round trip is a store_call
    this.renewal.stop();
    const uncertain = this.uncertain && !this.uncertainHooks?.landed;
    // A claim not known to have landed may land after the run settled, on a client that sends
    // failed calls later (its save, dropped meanwhile, never came after it): the save waits
    // until maxHoldSeconds, to come after it. Tried only until the lease ended, the save gave up,
    // the late claim held the key with nothing to complete it, and a retry ran again (an adversarial helper: 40 of 40 keys).
    const leaseEndsAt = this.renewal.leaseEndsAt;
    const tryUntil = uncertain && this.calls.store.deliversLate ? Math.max(this.renewal.holdEndsAtWall, leaseEndsAt) : leaseEndsAt;
    return this.calls.save(this.storageKey, this.token, response, this.route, tryUntil, uncertain, this.events, this);
  }

  release(): Promise<void> {
    this.events?.settled();
    this.renewal.stop();
    return this.calls.release(this.storageKey, this.token, this.route.handler, this.events, this);
  }
}

/**
 * The renewal of a claim a fail-open run may hold: the store's answer to the claim was lost. A
 * renewal that lands says the claim landed: from then on it is the claim's, reported as any.
 * Before that, a failed or refused renewal, and the lease ending, say only that it did not land
 * (or not yet): not logged (the outage was, as `fail_open`; a line each flooded the log).
 */
class UncertainRenewalHooks implements LeaseRenewalHooks {
  landed = false;

  constructor(private readonly hooks: RenewalHooks) {}

  renew(sent: () => void): Promise<boolean> {
    return this.hooks.renew(sent);
  }

  renewed(): void {
    this.landed = true;
    this.hooks.renewed();
  }

  failed(error: unknown): void {
    if (this.landed) this.hooks.failed(error);
  }

  lost(why: string): void {
    if (this.landed) this.hooks.lost(why);
    else this.hooks.ended();
  }
}

/** What a claim's renewal does and reports (`LeaseRenewalHooks`), counted, reported and logged. */
class RenewalHooks implements LeaseRenewalHooks {
  constructor(
    private readonly calls: StoreCalls,
    private readonly hold: Hold,
    private readonly storageKey: string,
    private readonly token: string,
    private readonly route: GuardedRoute,
    private readonly events: CallEvents | undefined,
  ) {}

  renew(sent: () => void): Promise<boolean> {
    return this.calls.timed('renew', this.events, () => this.calls.store.renew(this.storageKey, this.token, this.route.leaseMs, sent));
  }

  renewed(): void {
    this.calls.counters.count('renewed', this.route.handler);
    this.events?.emit('renewed', {});
  }

  failed(error: unknown): void {
    this.calls.counters.count('storeErrors', this.route.handler);
    this.events?.emit('store_error', { operation: 'renew', error });
    this.calls.logger.warn(`${this.route.handler}: could not renew the claim (${(error as Error).message}); trying again until its lease ends`);
  }

  /** The renewal ended without a save or release: nothing is left to wait for at shutdown. */
  ended(): void {
    this.calls.settled(this.hold);
  }

  lost(why: string): void {
    this.hold.lost = true;
    this.ended();
    this.calls.counters.count('leasesLost', this.route.handler);
    this.events?.emit('lease_lost', { reason: why });
    this.calls.logger.error(`${this.route.handler}: lost the claim while the handler runs (${why}); a retry may run the handler again`);
  }
}

/** Whether `settled` resolves within `ms` (a timer that holds the process open meanwhile: Nest awaits the drain). */
async function settledWithin(settled: Promise<void>, ms: number): Promise<boolean> {
  let timer: NodeJS.Timeout | undefined;
  const late = new Promise<false>((resolve) => (timer = setTimeout(() => resolve(false), ms)));
  try {
    return await Promise.race([settled.then(() => true as const), late]);
  } finally {
    clearTimeout(timer);
  }
}
