import { Inject, Injectable, Logger, Optional } from '@nestjs/common';
import { HealthIndicatorService, type HealthIndicatorResult } from '@nestjs/terminus';
import { randomUUID } from 'node:crypto';
import { IDEMPOTENCY_DEFAULTS, IDEMPOTENCY_RESOLVED_OPTIONS, IdempotencyStore, type ResolvedIdempotencyOptions } from '../index.js';

/** How long the probe's claim holds its key at most, should its release not land. */
const PROBE_LEASE_MS = 5000;

/**
 * A `@nestjs/terminus` health indicator for the idempotency store: it asks the store (Redis PING,
 * a PostgreSQL query, ...), then claims and frees a probe key of its own
 * (`<keyPrefix>:health-probe:<uuid>`, a key no request has), as the guard claims. A store that
 * answers but refuses writes (a Redis replica after a failover: READONLY; maxmemory under
 * noeviction: OOM) was reported up while every claim failed and fail-open routes ran unguarded
 * (an adversarial helper). Import it from `health/index.js` (terminus is an optional peer),
 * provide it next to `TerminusModule`, and add `() => indicator.isHealthy('idempotency')` to a
 * health check.
 */
@Injectable()
export class IdempotencyHealthIndicator {
  private readonly keyPrefix: string;

  constructor(
    private readonly store: IdempotencyStore,
    private readonly health: HealthIndicatorService,
    @Optional() @Inject(IDEMPOTENCY_RESOLVED_OPTIONS) options?: Pick<ResolvedIdempotencyOptions, 'keyPrefix'>,
  ) {
    this.keyPrefix = options?.keyPrefix ?? IDEMPOTENCY_DEFAULTS.keyPrefix;
    // The store came from elsewhere than IdempotencyModule: an ACL narrowed to the guard's prefix would refuse the probe.
    if (!options) {
      new Logger(IdempotencyHealthIndicator.name).warn(
        `no IdempotencyModule options where the indicator is provided: its probe key takes the default prefix "${this.keyPrefix}:"`,
      );
    }
  }

  async isHealthy<const Key extends string>(key: Key, timeoutMs = 1000): Promise<HealthIndicatorResult<Key>> {
    const indicator = this.health.check(key);
    const started = performance.now();
    let timer: NodeJS.Timeout | undefined;
    try {
      await Promise.race([
        this.check(),
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

  /** Asks the store, then claims and frees a probe key: it must take writes, as every claim does. */
  private async check(): Promise<void> {
    await this.store.ping();
    const probe = { key: `${this.keyPrefix}:health-probe:${randomUUID()}`, token: randomUUID(), fingerprint: '', leaseMs: PROBE_LEASE_MS };
    const claimed = await this.store.claim(probe);
    if (claimed.status === 'acquired') await this.store.release(probe.key, probe.token);
  }
}
