import type { Logger } from '@nestjs/common';

/**
 * Delete up to $1 expired rows of `table` (identified by `idColumn`), oldest first. Rows a
 * concurrent statement holds (a claim taking one over, a fenced transaction) are locked by it and
 * skipped; the outer condition re-checks expiry on the row it deletes. Affects the rows deleted.
 */
export const purgeExpiredSql = (table: string, idColumn: 'key' | 'id') => `
DELETE FROM ${table} AS r
 WHERE r."${idColumn}" IN (
         SELECT e."${idColumn}" FROM ${table} AS e
          WHERE e."expires_at" <= now()
          ORDER BY e."expires_at"
          LIMIT $1
            FOR UPDATE SKIP LOCKED)
   AND r."expires_at" <= now()`;

/** Runs `deleteBatch(size)` until a batch deletes fewer rows than `size`; returns how many in all. */
export async function purgeInBatches(deleteBatch: (size: number) => Promise<number>, size: number): Promise<number> {
  let total = 0;
  for (;;) {
    const deleted = await deleteBatch(size);
    total += deleted;
    if (deleted < size) return total;
  }
}

/**
 * Runs a purge every `intervalMs` on an unref'd timer (it never keeps the process alive), one at
 * a time, logging what it deleted or why it failed. `stop()` waits for a running purge, so that
 * the DataSource is not closed under it.
 */
export class PurgeSchedule {
  private timer?: NodeJS.Timeout;
  private running?: Promise<unknown>;

  constructor(
    private readonly purge: () => Promise<number>,
    private readonly logger: Logger,
    private readonly what: string,
  ) {}

  start(intervalMs: number | undefined): void {
    if (!intervalMs || this.timer) return;
    this.timer = setInterval(() => this.runOnce(), intervalMs);
    this.timer.unref();
  }

  async stop(): Promise<void> {
    clearInterval(this.timer);
    this.timer = undefined;
    await this.running;
  }

  private runOnce(): void {
    if (this.running) return;
    this.running = this.purge()
      .then((count) => count > 0 && this.logger.debug(`Purged ${count} expired ${this.what}`))
      .catch((error: Error) => this.logger.warn(`Purging expired ${this.what} failed: ${error.message}`))
      .finally(() => (this.running = undefined));
  }
}
