import { Injectable } from '@nestjs/common';
import { HealthIndicatorService, type HealthIndicatorResult } from '@nestjs/terminus';
import { IdempotencyStore } from '../index.js';

/**
 * A `@nestjs/terminus` health indicator for the idempotency store (Redis PING, a PostgreSQL
 * query, ...). Import it from `health/index.js` (terminus is an optional peer), provide it next
 * to `TerminusModule`, and add `() => indicator.isHealthy('idempotency')` to a health check.
 */
@Injectable()
export class IdempotencyHealthIndicator {
  constructor(
    private readonly store: IdempotencyStore,
    private readonly health: HealthIndicatorService,
  ) {}

  async isHealthy<const Key extends string>(key: Key, timeoutMs = 1000): Promise<HealthIndicatorResult<Key>> {
    const indicator = this.health.check(key);
    const started = performance.now();
    let timer: NodeJS.Timeout | undefined;
    try {
      await Promise.race([
        this.store.ping(),
        // One loop turn past the timer, as the store's own bounds (stores/within-deadline.ts): after
        // a stall of the process, an answer that arrived in time is read first and wins.
        new Promise((_, reject) => {
          timer = setTimeout(() => setImmediate(() => reject(new Error(`no answer within ${timeoutMs} ms`))), timeoutMs);
        }),
      ]);
      return indicator.up({ store: this.store.constructor.name, responseTimeMs: Math.round(performance.now() - started) });
    } catch (error) {
      return indicator.down({ store: this.store.constructor.name, message: (error as Error).message });
    } finally {
      clearTimeout(timer);
    }
  }
}
