import { IdempotencyConfigError } from '../errors/idempotency.errors.js';
import type { Registry } from 'prom-client';
import type { IdempotencyMetricsSink, IdempotencyOutcome } from './idempotency-counters.js';

/** Prometheus metrics of the guard (`metrics` option; `prom-client` is an optional peer). */
export interface PrometheusMetricsOptions {
  /** Registry to register on. Default: prom-client's global registry. */
  registry?: Registry;
  /** Metric name prefix. Default `idempotency_`. */
  prefix?: string;
}

type LeaseEvent = 'renewed' | 'leasesLost';
const LEASE_EVENTS: Record<LeaseEvent, string> = { renewed: 'renewed', leasesLost: 'lost' };
const isLeaseEvent = (outcome: IdempotencyOutcome): outcome is LeaseEvent => outcome in LEASE_EVENTS;

const OUTCOME_LABELS: Record<Exclude<IdempotencyOutcome, LeaseEvent>, string> = {
  acquired: 'acquired',
  replayed: 'replayed',
  inProgress: 'in_progress',
  waited: 'waited',
  mismatched: 'key_reused',
  released: 'released',
  lateCompletions: 'lease_takeover',
  storeErrors: 'store_error',
  failOpen: 'fail_open',
  shuttingDown: 'shutting_down',
};

/**
 * `<prefix>requests_total{handler, outcome}` (handler = `Controller.method`, so label values are
 * bounded by the routes), `<prefix>leases_total{handler, event}` (claims `renewed` and `lost`
 * while their handlers ran) and `<prefix>store_duration_seconds{operation}`.
 */
export async function createPrometheusSink(options: PrometheusMetricsOptions = {}): Promise<IdempotencyMetricsSink> {
  const prom = await import('prom-client').catch((error: unknown) => {
    throw new IdempotencyConfigError('IdempotencyModule: metrics needs the prom-client package: npm install prom-client', { cause: error });
  });
  const registry = options.registry ?? prom.register;
  const prefix = options.prefix ?? 'idempotency_';
  // Reused when already registered: an app created twice in one process shares its metrics.
  const requests =
    registered<InstanceType<typeof prom.Counter<'handler' | 'outcome'>>>(registry, `${prefix}requests_total`, 'counter', ['handler', 'outcome']) ??
    new prom.Counter({
      name: `${prefix}requests_total`,
      help: 'Calls through the idempotency guard, by handler and outcome',
      labelNames: ['handler', 'outcome'] as const,
      registers: [registry],
    });
  const leases =
    registered<InstanceType<typeof prom.Counter<'handler' | 'event'>>>(registry, `${prefix}leases_total`, 'counter', ['handler', 'event']) ??
    new prom.Counter({
      name: `${prefix}leases_total`,
      help: 'Claims renewed and lost while their handlers ran, by handler and event',
      labelNames: ['handler', 'event'] as const,
      registers: [registry],
    });
  const store =
    registered<InstanceType<typeof prom.Histogram<'operation'>>>(registry, `${prefix}store_duration_seconds`, 'histogram', ['operation']) ??
    new prom.Histogram({
      name: `${prefix}store_duration_seconds`,
      help: 'Duration of idempotency store calls',
      labelNames: ['operation'] as const,
      buckets: [0.0005, 0.001, 0.002, 0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 1],
      registers: [registry],
    });
  return {
    count: (outcome, handler) =>
      isLeaseEvent(outcome)
        ? leases.inc({ handler, event: LEASE_EVENTS[outcome] })
        : requests.inc({ handler, outcome: OUTCOME_LABELS[outcome] }),
    observeStore: (operation, seconds) => store.observe({ operation }, seconds),
  };
}

/**
 * The metric registered under `name`, when it is the guard's kind (another app of the process made
 * it); a metric of another type or labels there is refused: taken as the guard's, the app started
 * and the guard's metrics went missing, an error logged per event type (an adversarial helper).
 */
function registered<M>(registry: Registry, name: string, type: 'counter' | 'histogram', labelNames: readonly string[]): M | undefined {
  const found = registry.getSingleMetric(name) as { type?: string; labelNames?: readonly string[] } | undefined;
  if (!found) return undefined;
  const labels = found.labelNames ?? [];
  // prom-client reads labels by name: their order is no matter (each once: a label twice is another set).
  const same = labels.length === labelNames.length && [...labels].sort().join('\n') === [...labelNames].sort().join('\n');
  if (found.type !== type || !same) {
    throw new IdempotencyConfigError(
      `IdempotencyModule metrics: ${name} is already registered as a ${found.type ?? 'metric'} of labels [${labels.join(', ')}], ` +
        `not the guard's ${type} of [${labelNames.join(', ')}]; give metrics another prefix or registry`,
    );
  }
  return found as M;
}
