import type { Logger } from '@nestjs/common';

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
