import type { IdempotencyEvent, IdempotencyEventListener, IdempotencyEventType } from '../events/idempotency-event.js';
import type { IdempotencyMetricsSink, IdempotencyOutcome } from './idempotency-counters.js';

/** The counted outcome of each event that counts one (`in_progress` and `store_call` are mapped below). */
const OUTCOME_OF: Record<Exclude<IdempotencyEventType, 'in_progress' | 'store_call' | 'completed'>, IdempotencyOutcome> = {
  acquired: 'acquired',
  replayed: 'replayed',
  key_reused: 'mismatched',
  released: 'released',
  lease_takeover: 'lateCompletions',
  store_error: 'storeErrors',
  fail_open: 'failOpen',
  shutting_down: 'shuttingDown',
  renewed: 'renewed',
  lease_lost: 'leasesLost',
};

/**
 * A metrics sink (Prometheus, when `metrics` is on) as a listener of the guard's events: it counts
 * what `IdempotencyCounters` counts, per handler, and times the store calls.
 */
export function metricsListener(sink: IdempotencyMetricsSink): IdempotencyEventListener {
  return function idempotencyMetrics(event: IdempotencyEvent): void {
    switch (event.type) {
      case 'store_call':
        return sink.observeStore(event.operation, event.durationMs / 1000);
      case 'in_progress':
        return sink.count(event.waiting ? 'waited' : 'inProgress', event.handler);
      case 'completed':
        return; // counted by no metric: a first request is counted when its claim is won
      default:
        return sink.count(OUTCOME_OF[event.type], event.handler);
    }
  };
}
