import { describe, expect, it } from '@jest/globals';
import { Registry } from 'prom-client';
import type { IdempotencyEvent } from '../events/idempotency-event.js';
import type { IdempotencyOutcome } from './idempotency-counters.js';
import { metricsListener } from './metrics-listener.js';
import { createPrometheusSink } from './prometheus-metrics.js';

const base = { handler: 'OrdersController.create', transport: 'http', user: '42', keyHash: 'ab', elapsedMs: 1 } as const;

/** Each event, and what the guard counted for it before the metrics listened to events. */
const CASES: [IdempotencyEvent, IdempotencyOutcome | undefined][] = [
  [{ ...base, type: 'acquired' }, 'acquired'],
  [{ ...base, type: 'replayed', statusCode: 201 }, 'replayed'],
  [{ ...base, type: 'in_progress', retryAfterMs: 100, waiting: false }, 'inProgress'],
  [{ ...base, type: 'in_progress', retryAfterMs: 100, waiting: true }, 'waited'],
  [{ ...base, type: 'key_reused' }, 'mismatched'],
  [{ ...base, type: 'released', handlerMs: 1 }, 'released'],
  [{ ...base, type: 'lease_takeover', handlerMs: 1 }, 'lateCompletions'],
  [{ ...base, type: 'store_error', operation: 'renew', error: new Error('down') }, 'storeErrors'],
  [{ ...base, type: 'fail_open' }, 'failOpen'],
  [{ ...base, type: 'shutting_down' }, 'shuttingDown'],
  [{ ...base, type: 'renewed' }, 'renewed'],
  [{ ...base, type: 'lease_lost', reason: 'refused' }, 'leasesLost'],
  [{ ...base, type: 'completed', handlerMs: 1, statusCode: 201 }, undefined],
];

describe('metricsListener', () => {
  it('writes the Prometheus metrics the guard wrote before they listened to events: same names, labels and values', async () => {
    const before = new Registry();
    const after = new Registry();
    const sink = await createPrometheusSink({ registry: before });
    const listener = metricsListener(await createPrometheusSink({ registry: after }));

    for (const [event, outcome] of CASES) {
      if (outcome) sink.count(outcome, event.handler);
      listener(event);
    }
    sink.observeStore('claim', 0.002);
    listener({ ...base, type: 'store_call', operation: 'claim', durationMs: 2 });

    const text = await after.metrics();
    expect(text).toBe(await before.metrics());
    expect(text).toContain('idempotency_requests_total{handler="OrdersController.create",outcome="waited"} 1');
    expect(text).toContain('idempotency_leases_total{handler="OrdersController.create",event="lost"} 1');
    expect(text).toContain('idempotency_store_duration_seconds_bucket{le="0.002",operation="claim"} 1');
  });
});
