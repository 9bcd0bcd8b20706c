import { performance } from 'node:perf_hooks';

/** What a renewal does and reports: the store call, and what each result means to the guard. */
export interface LeaseRenewalHooks {
  /**
   * Renews the claim in the store (fenced by its token): false when the token holds it no more.
   * `sent` is called when the renewal goes out to the store's server (`IdempotencyStore.renew`).
   */
  renew(sent: () => void): Promise<boolean>;
  renewed(): void;
  /** A renewal failed (the store is down or slow); renewing goes on until the lease ends. */
  failed(error: unknown): void;
  /** The claim is lost while the handler may still run: a retry may run it again. */
  lost(why: string): void;
}

/** Renewals per lease: a claim is renewed every third of its lease. */
const RENEWALS_PER_LEASE = 3;
/** A failed renewal is tried again this soon, then backing off (never past half the lease left). */
const RETRY_MS = 100;
/** A monotonic clock: a stepped wall clock neither ends a lease early nor holds a key past `maxHoldMs`. */
const now = () => performance.now();

/**
 * Keeps a held claim alive while its handler runs. Every third of the lease it renews the claim
 * (one fenced store call), so that a live handler that runs for many leases keeps its claim and
 * runs once, while a crashed process renews nothing and its keys free within one lease. A
 * handler shorter than a third of the lease costs no renewal.
 *
 * The claim is lost when the lease ends with no renewal landed (a renewal refused because the
 * token holds the key no more, renewals failing or hanging while the store is down or its pool
 * is busy), or at `maxHoldMs` (no lease is renewed past it, so a handler that never ends cannot
 * hold its key for ever). A deadline timer at the lease's end decides, whatever a renewal in
 * flight still does. Then `signal` aborts, for a handler that reads it (`@LeaseSignal()`) to
 * stop before its effect.
 *
 * A `tentative` claim is one whose claim call failed (fail-open): it may have landed, or may land
 * later (a paused or reconnecting store runs it when it answers again), and holds the key one
 * lease from then. Until a renewal lands, nothing is lost: failed and refused renewals go on
 * every third of a lease, until the handler settles or `maxHoldMs`, whenever the claim lands.
 * Renewing only until the first lease ended let a claim that landed after a longer outage expire
 * while the handler ran, and a duplicate run beside it (an adversarial helper: 40 of 40 keys).
 */
export class LeaseRenewal {
  /** Made when the signal is first read: most handlers never read it (an AbortController per call was a third of the memory a call kept past a young-generation collection). */
  private aborter?: AbortController;
  /** Why the claim was lost, once it is. */
  private lostWith?: Error;
  private readonly everyMs: number;
  private readonly holdEndsAt: number;
  /** Wall-clock time minus the monotonic clock, for `leaseEndsAt`. */
  private readonly wallOffset = Date.now() - now();
  private timer?: NodeJS.Timeout;
  private deadline?: NodeJS.Timeout;
  private stopped = false;
  /** When the lease ends unless renewed, by the monotonic clock. */
  private endsAt: number;

  constructor(
    private readonly leaseMs: number,
    maxHoldMs: number,
    private readonly hooks: LeaseRenewalHooks,
    /** The claim may not have landed (its call failed): until a renewal lands, nothing is lost. */
    private tentative = false,
  ) {
    const start = now();
    this.endsAt = start + leaseMs;
    this.holdEndsAt = start + maxHoldMs;
    this.everyMs = leaseMs / RENEWALS_PER_LEASE;
    // One timer per claim: the deadline is armed only once a renewal starts, or when none will.
    if (!this.next(this.everyMs)) this.armDeadline();
  }

  /** Aborted when the claim is lost while the handler runs. */
  get signal(): AbortSignal {
    if (!this.aborter) {
      this.aborter = new AbortController();
      if (this.lostWith) this.aborter.abort(this.lostWith);
    }
    return this.aborter.signal;
  }

  /** When the lease ends, by this process's wall clock, unless renewed again. */
  get leaseEndsAt(): number {
    return this.endsAt + this.wallOffset;
  }

  /** When `maxHoldMs` ends, by this process's wall clock. */
  get holdEndsAtWall(): number {
    return this.holdEndsAt + this.wallOffset;
  }

  /** The claim is settled (saved or released): no more renewals, and nothing more to lose. */
  stop(): void {
    this.stopped = true;
    clearTimeout(this.timer);
    clearTimeout(this.deadline);
  }

  /**
   * Whatever a renewal in flight does, the claim is lost when the lease ends unrenewed. The
   * deadline decides one turn of the event loop past its timer: after the process stalled past
   * the lease's end (a GC pause, a CPU-starved container), Node runs due timers before it reads
   * its sockets, and a renewal the store took before the stall is read in that turn and counts.
   */
  private armDeadline(): void {
    clearTimeout(this.deadline);
    const pastHold = this.endsAt + this.everyMs + this.leaseMs > this.holdEndsAt;
    const why = pastHold ? 'the handler ran past maxHoldSeconds, so the claim was not renewed' : 'no renewal landed before the lease ended';
    const endsAt = this.endsAt;
    const decide = () => {
      if (this.endsAt > endsAt) return; // renewed meanwhile: its own renewals arm the next deadline
      this.lose(why);
    };
    this.deadline = setTimeout(() => setImmediate(decide), Math.max(this.endsAt - now(), 0));
    this.deadline.unref();
  }

  /** Renews in `delayMs`, unless that lease would end past `maxHoldMs`; says whether it will. */
  private next(delayMs: number, failures = 0): boolean {
    if (now() + delayMs + this.leaseMs > this.holdEndsAt) return false;
    this.timer = setTimeout(() => void this.renewNow(failures), delayMs);
    this.timer.unref();
    return true;
  }

  private async renewNow(failures = 0): Promise<void> {
    if (this.stopped) return;
    const startedAt = now();
    // Whatever this renewal (or its retries) does, the lease's end decides.
    // A tentative claim has no lease of its own yet: it may land at any time.
    if (failures === 0 && !this.tentative) this.armDeadline();
    // When the renewal went out: the store's server counts the new lease from then or later.
    // Counted from when it was asked for, a renewal that waited for a busy pool's connection
    // took the claim for lost one wait before its lease ended in the store: no more renewals
    // went, and a duplicate took the key (an adversarial helper: a pool of 3 shared with 0.7 s
    // handler transactions and 1 s leases, up to 39 of 140 keys ran twice).
    let sentAt = startedAt;
    let held: boolean;
    try {
      held = await this.hooks.renew(() => {
        sentAt = now();
      });
    } catch (error) {
      if (this.stopped) return;
      this.hooks.failed(error);
      const delay = Math.min(this.everyMs, RETRY_MS * 2 ** failures);
      if (this.tentative) return this.goOn(delay, failures + 1);
      // Soon, then backing off, never at or past the lease's end: the deadline decides there.
      const retryIn = Math.min(delay, Math.max((this.endsAt - now()) / 2, 10));
      if (now() + retryIn >= this.endsAt) return;
      this.timer = setTimeout(() => void this.renewNow(failures + 1), retryIn);
      this.timer.unref();
      return;
    }
    if (this.stopped) return;
    // Not landed, or not yet: the claim call may still run (queued in a paused or reconnecting store).
    if (!held && this.tentative) return this.goOn(this.everyMs, 0);
    if (!held) return this.lose('the store refused the renewal: the lease had run out, or the key was deleted');
    this.tentative = false;
    this.endsAt = Math.max(this.endsAt, sentAt + this.leaseMs);
    clearTimeout(this.deadline);
    this.hooks.renewed();
    // A third of a lease after this renewal was sent, not after its answer was read: an answer
    // read late (the process stalled) leaves less of the lease, and the next renewal goes sooner.
    if (!this.next(Math.max(startedAt + this.everyMs - now(), 0))) this.armDeadline();
  }

  /** A tentative claim's next renewal; past `maxHoldMs` it is given up (a claim that lands later expires one lease after). */
  private goOn(delayMs: number, failures: number): void {
    if (!this.next(delayMs, failures)) this.lose('the handler ran past maxHoldSeconds, so the claim was not renewed');
  }

  private lose(why: string): void {
    if (this.stopped) return;
    this.stop();
    this.hooks.lost(why);
    this.lostWith = new Error(`The idempotency claim was lost: ${why}`);
    this.aborter?.abort(this.lostWith);
  }
}
