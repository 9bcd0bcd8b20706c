/** What a renewal does and reports: the store call, and what each result means to the guard. */
export interface LeaseRenewalHooks {
  /** Renews the claim in the store (fenced by its token): false when the token holds it no more. */
  renew(): Promise<boolean>;
  renewed(): void;
  /** A renewal failed (the store is down or slow); renewing goes on until the lease ends. */
  failed(error: unknown): void;
  /** The claim is lost while the handler may still run: a retry may run it again. */
  lost(why: string): void;
}

/** Renewals per lease: a claim is renewed every third of its lease. */
const RENEWALS_PER_LEASE = 3;

/**
 * Keeps a held claim alive while its handler runs. Every third of the lease it renews the claim
 * (one fenced store call), so that a live handler that runs for many leases keeps its claim and
 * runs once, while a crashed process renews nothing and its keys free within one lease. A
 * handler shorter than a third of the lease costs no renewal.
 *
 * The claim is lost when a renewal is refused (the token holds it no more: the lease ran out
 * before the renewal landed, or somebody deleted the key), when renewals fail until the lease
 * ends (the store is down), or at `maxHoldMs` (no lease is renewed past it, so a handler that
 * never ends cannot hold its key for ever). Then `signal` aborts, for a handler that reads it
 * (`@LeaseSignal()`) to stop before its effect.
 */
export class LeaseRenewal {
  private readonly aborter = new AbortController();
  private readonly everyMs: number;
  private readonly holdEndsAt: number;
  private timer?: NodeJS.Timeout;
  private stopped = false;
  private endsAt: number;

  constructor(
    private readonly leaseMs: number,
    maxHoldMs: number,
    private readonly hooks: LeaseRenewalHooks,
  ) {
    const now = Date.now();
    this.endsAt = now + leaseMs;
    this.holdEndsAt = now + maxHoldMs;
    this.everyMs = leaseMs / RENEWALS_PER_LEASE;
    this.next(this.everyMs);
  }

  /** Aborted when the claim is lost while the handler runs. */
  get signal(): AbortSignal {
    return this.aborter.signal;
  }

  /** When the lease ends, by this process's clock, unless renewed again. */
  get leaseEndsAt(): number {
    return this.endsAt;
  }

  /** The claim is settled (saved or released): no more renewals, and nothing more to lose. */
  stop(): void {
    this.stopped = true;
    clearTimeout(this.timer);
  }

  /** Renews in `delayMs`, unless that lease would end past `maxHoldMs`: then lets it run out. */
  private next(delayMs: number): void {
    const renewing = Date.now() + delayMs + this.leaseMs <= this.holdEndsAt;
    const run = renewing ? () => void this.renewNow() : () => this.lose('the handler ran past maxHoldSeconds, so the claim was not renewed');
    this.timer = setTimeout(run, renewing ? delayMs : Math.max(this.endsAt - Date.now(), 0));
    this.timer.unref();
  }

  private async renewNow(): Promise<void> {
    if (this.stopped) return;
    const startedAt = Date.now();
    let held: boolean;
    try {
      held = await this.hooks.renew();
    } catch (error) {
      if (this.stopped) return;
      this.hooks.failed(error);
      const left = this.endsAt - Date.now();
      if (left <= 0) return this.lose('renewals failed until the lease ended');
      return this.next(Math.min(this.everyMs, left));
    }
    if (this.stopped) return;
    if (!held) return this.lose('the store refused the renewal: the lease had run out, or the key was deleted');
    this.endsAt = startedAt + this.leaseMs;
    this.hooks.renewed();
    this.next(this.everyMs);
  }

  private lose(why: string): void {
    if (this.stopped) return;
    this.stop();
    this.hooks.lost(why);
    this.aborter.abort(new Error(`The idempotency claim was lost: ${why}`));
  }
}
