import type { Logger } from '@nestjs/common';
import { IDEMPOTENCY_DEFAULTS, IdempotencyConfigError } from '../../index.js';
import type { RunStatement } from './statements.js';

/**
 * Delete up to $1 expired rows of `table` (identified by `idColumn`), oldest first. Rows a
 * concurrent statement holds (a claim taking one over, a fenced transaction) are locked by it and
 * skipped; the outer condition re-checks expiry on the row it deletes. Affects the rows deleted.
 * With a `claimState`, a row in that state (a claim: the store's 'processing', the outcome
 * recorder's 'PROCESSING') is deleted only $2 milliseconds past its expiry: its run may still
 * save into it (`completeAfterLease`, the recorder's late owner).
 */
const purgeExpiredSql = (table: string, idColumn: 'key' | 'id', claimState: string | undefined) => {
  const expired = (row: string) =>
    claimState
      ? `${row}."expires_at" <= now() AND (${row}."state" <> '${claimState}' OR ${row}."expires_at" <= now() - $2 * interval '1 millisecond')`
      : `${row}."expires_at" <= now()`;
  return `
DELETE FROM ${table} AS r
 WHERE r."${idColumn}" IN (
         SELECT e."${idColumn}" FROM ${table} AS e
          WHERE ${expired('e')}
          ORDER BY e."expires_at"
          LIMIT $1
            FOR UPDATE SKIP LOCKED)
   AND ${expired('r')}`;
};

/** The longest `keepExpiredClaimsMs`: a year (PostgreSQL's timestamps end; past ~2e14 ms every purge failed, completed records' too). */
const MAX_KEPT_CLAIMS_MS = 365 * 24 * 3600 * 1000;

/**
 * The option `keepExpiredClaimsMs` of `owner`, checked; by default twice the guard's
 * `maxHoldSeconds` (600 s): a run whose lease was lost early may still run that long, then try
 * its save for `maxHoldSeconds` more.
 */
export function keptClaimsMs(owner: string, value: number = 2 * IDEMPOTENCY_DEFAULTS.maxHoldSeconds * 1000): number {
  if (!Number.isFinite(value) || value < 0 || value > MAX_KEPT_CLAIMS_MS) {
    throw new IdempotencyConfigError(
      `${owner}: keepExpiredClaimsMs must be a number of milliseconds from 0 to ${MAX_KEPT_CLAIMS_MS.toLocaleString('en')} (a year), got ${value}`,
    );
  }
  return value;
}

/** How a table's expired rows are purged: its statement runner, table and options. */
export interface ExpiredRowsPurgeOptions {
  run: RunStatement;
  table: string;
  idColumn: 'key' | 'id';
  /** Rows one statement deletes at most. Default 1000. */
  batchSize?: number;
  /** Purges every this many milliseconds from `start()`; undefined: only when called. */
  intervalMs?: number;
  logger: Logger;
  /** Expired claims (rows in state `claimState`) are kept this many milliseconds more. */
  keepExpiredClaimsMs?: number;
  /** The state of a claim's row. Default 'processing' (the store's and IdempotentTransactions'). */
  claimState?: string;
  /** What the rows are, for the log: e.g. `idempotency records`. */
  what: string;
}

/**
 * Deletes a table's expired rows in batches (`purgeExpired()`, until a batch deletes fewer rows
 * than its size), and on a schedule: every `intervalMs` on an unref'd timer (it never keeps the
 * process alive), one purge at a time, logging what it deleted or why it failed. `stop()` waits
 * for a running purge, so that the DataSource is not closed under it.
 */
export class ExpiredRowsPurge {
  private readonly sql: string;
  private timer?: NodeJS.Timeout;
  private running?: Promise<unknown>;

  constructor(private readonly options: ExpiredRowsPurgeOptions) {
    const claimState = options.keepExpiredClaimsMs === undefined ? undefined : (options.claimState ?? 'processing');
    this.sql = purgeExpiredSql(options.table, options.idColumn, claimState);
  }

  /** Deletes every expired row, a batch per statement; returns how many. */
  async purgeExpired(): Promise<number> {
    const size = this.options.batchSize ?? 1000;
    let total = 0;
    for (;;) {
      const params = this.options.keepExpiredClaimsMs === undefined ? [size] : [size, this.options.keepExpiredClaimsMs];
      const deleted = (await this.options.run(this.sql, params)).affected ?? 0;
      total += deleted;
      if (deleted < size) return total;
    }
  }

  start(): void {
    if (!this.options.intervalMs || this.timer) return;
    this.timer = setInterval(() => this.runOnce(), this.options.intervalMs);
    this.timer.unref();
  }

  async stop(): Promise<void> {
    clearInterval(this.timer);
    this.timer = undefined;
    await this.running;
  }

  private runOnce(): void {
    if (this.running) return;
    const { logger, what } = this.options;
    this.running = this.purgeExpired()
      .then((count) => count > 0 && logger.debug(`Purged ${count} expired ${what}`))
      .catch((error: Error) => logger.warn(`Purging expired ${what} failed: ${error.message}`))
      .finally(() => (this.running = undefined));
  }
}
