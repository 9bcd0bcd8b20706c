import { Injectable } from '@nestjs/common';
import { HealthIndicatorService, type HealthIndicatorResult } from '@nestjs/terminus';
import { IdempotencyStore } from '../index.js';
import { withinDeadline } from '../stores/within-deadline.js';

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
    try {
      await withinDeadline(this.store.ping(), timeoutMs);
      return indicator.up({ store: this.store.constructor.name, responseTimeMs: Math.round(performance.now() - started) });
    } catch (error) {
      return indicator.down({ store: this.store.constructor.name, message: (error as Error).message });
    }
  }
}
