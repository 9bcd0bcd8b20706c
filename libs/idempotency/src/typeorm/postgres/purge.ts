import type { Logger } from '@nestjs/common';
import type { RunStatement } from './statements.js';

/**
 * Delete up to $1 expired rows of `table` (identified by `idColumn`), oldest first. Rows a
 * concurrent statement holds (a claim taking one over, a fenced transaction) are locked by it and
 * skipped; the outer condition re-checks expiry on the row it deletes. Affects the rows deleted.
 */
const purgeExpiredSql = (table: string, idColumn: 'key' | 'id') => `
DELETE FROM ${table} AS r
 WHERE r."${idColumn}" IN (
         SELECT e."${idColumn}" FROM ${table} AS e
          WHERE e."expires_at" <= now()
          ORDER BY e."expires_at"
          LIMIT $1
            FOR UPDATE SKIP LOCKED)
   AND r."expires_at" <= now()`;

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
    this.sql = purgeExpiredSql(options.table, options.idColumn);
  }

  /** Deletes every expired row, a batch per statement; returns how many. */
  async purgeExpired(): Promise<number> {
    const size = this.options.batchSize ?? 1000;
    let total = 0;
    for (;;) {
      const deleted = (await this.options.run(this.sql, [size])).affected ?? 0;
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
