import { describe, expect, it } from '@jest/globals';
import { Counter, Gauge, Histogram, Registry } from 'prom-client';
import { createPrometheusSink } from './prometheus-metrics.js';

describe('createPrometheusSink', () => {
  it('shares its metrics with a second app of the process on one registry', async () => {
    const registry = new Registry();
    const first = await createPrometheusSink({ registry });
    const second = await createPrometheusSink({ registry });
    first.count('acquired', 'Orders.create');
    second.count('acquired', 'Orders.create');
    expect((await registry.getSingleMetric('idempotency_requests_total')!.get()).values).toEqual([
      { labels: { handler: 'Orders.create', outcome: 'acquired' }, value: 2 },
    ]);
  });

  it('takes a metric of its kind with its labels in another order', async () => {
    const registry = new Registry();
    new Counter({ name: 'idempotency_requests_total', help: 'x', labelNames: ['outcome', 'handler'], registers: [registry] });
    (await createPrometheusSink({ registry })).count('replayed', 'Orders.create');
    expect((await registry.getSingleMetric('idempotency_requests_total')!.get()).values).toEqual([
      { labels: { handler: 'Orders.create', outcome: 'replayed' }, value: 1 },
    ]);
  });

  // helper-209: a metric of another type or other labels under one of its names was taken as its
  // own: the app started, and the guard's metrics went missing with an error per event type.
  it.each([
    ['a gauge', (registry: Registry) => new Gauge({ name: 'idempotency_requests_total', help: 'x', labelNames: ['handler', 'outcome'], registers: [registry] })],
    ['a counter with other labels', (registry: Registry) => new Counter({ name: 'idempotency_leases_total', help: 'x', labelNames: ['route'], registers: [registry] })],
    ['a counter for the histogram', (registry: Registry) => new Counter({ name: 'idempotency_store_duration_seconds', help: 'x', labelNames: ['operation'], registers: [registry] })],
    ['a histogram with other labels', (registry: Registry) => new Histogram({ name: 'idempotency_store_duration_seconds', help: 'x', registers: [registry] })],
    // helper-216: taken for the guard's by a check of each found label only.
    ['a counter with a label twice', (registry: Registry) => new Counter({ name: 'idempotency_requests_total', help: 'x', labelNames: ['outcome', 'outcome'], registers: [registry] })],
  ])('refuses at start-up a registry holding %s under one of its names, naming it', async (_what, register) => {
    const registry = new Registry();
    register(registry);
    await expect(createPrometheusSink({ registry })).rejects.toThrow(/metrics: .*idempotency_.* is already registered as .*; give metrics another prefix or registry/);
  });
});
