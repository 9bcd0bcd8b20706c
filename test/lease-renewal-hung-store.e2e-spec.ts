// a renewal that neither succeeds nor fails (it waits for a pool connection, or
// for a slow network) while the lease runs out. The store frees the key at the lease's end and
// another instance runs the handler again; the first handler's @LeaseSignal() must be aborted by
// then ("renewals failing until the lease ended" is a lost claim), not only when the stuck
// renewal finally returns.
import { afterAll, beforeAll, describe, expect, it } from '@jest/globals';
import { Controller, Inject, Post } from '@nestjs/common';
import { randomUUID } from 'node:crypto';
import type { DataSource } from 'typeorm';
import { IdempotencyCounters, LeaseSignal, NoRepeatSubmit } from '../libs/idempotency/src/index.js';
import { IDEMPOTENCY_ENTITIES, IDEMPOTENCY_MIGRATIONS, PostgresIdempotencyStore } from '../libs/idempotency/src/typeorm/index.js';
import { makeApp, raw, sleep, type EdgeApp } from './support/edge-app.js';
import { REDIS_URL } from './support/services.js';
import { TcpProxy } from './support/tcp-proxy.js';
import { dropSchemaDataSource, openSchemaDataSource, testSchemaName } from './support/test-schema.js';

const LEASE_SECONDS = 0.6;

/** What each run saw: which instance, and whether the other run's signal was aborted when it started. */
const runs: { instance: string; signal: AbortSignal; othersAbortedAtStart: boolean[] }[] = [];

@Controller()
class PgWorkController {
  constructor(@Inject('INSTANCE') private readonly instance: string, @Inject('DS') private readonly ds: DataSource) {}

  /** Does its work on the app's own database pool (as handlers do), for longer than a lease. */
  @Post('work')
  @NoRepeatSubmit({ leaseSeconds: LEASE_SECONDS })
  async work(@LeaseSignal() signal: AbortSignal) {
    runs.push({ instance: this.instance, signal, othersAbortedAtStart: runs.map((run) => run.signal.aborted) });
    await this.ds.query('select pg_sleep(2.5)');
    return { aborted: signal.aborted };
  }
}

@Controller()
class SlowWorkController {
  constructor(@Inject('INSTANCE') private readonly instance: string) {}

  @Post('slow')
  @NoRepeatSubmit({ leaseSeconds: LEASE_SECONDS })
  async slow(@LeaseSignal() signal: AbortSignal) {
    runs.push({ instance: this.instance, signal, othersAbortedAtStart: runs.map((run) => run.signal.aborted) });
    await Promise.race([sleep(4000), new Promise((resolve) => signal.addEventListener('abort', resolve))]);
    return { aborted: signal.aborted };
  }
}

describe('PostgreSQL pool exhausted by the handler\'s own queries', () => {
  const schema = testSchemaName();
  let dsA: DataSource;
  let dsB: DataSource;
  let a: EdgeApp;
  let b: EdgeApp;

  beforeAll(async () => {
    // Instance A: a pool of one connection (any pool that the app's own queries fill does the same).
    dsA = await openSchemaDataSource(schema, { entities: IDEMPOTENCY_ENTITIES, migrations: IDEMPOTENCY_MIGRATIONS, migrationsRun: true, extra: { max: 1 } });
    const { DataSource: DS } = await import('typeorm');
    dsB = new DS({ ...dsA.options, extra: {}, migrationsRun: false } as never) as DataSource;
    await dsB.initialize();
    const providers = (name: string, ds: DataSource) => [
      { provide: 'INSTANCE', useValue: name },
      { provide: 'DS', useValue: ds },
    ];
    a = await makeApp('express', [PgWorkController], { store: new PostgresIdempotencyStore(dsA) }, { providers: providers('A', dsA), setup: (app) => app.useLogger(false) });
    b = await makeApp('express', [PgWorkController], { store: new PostgresIdempotencyStore(dsB) }, { providers: providers('B', dsB), setup: (app) => app.useLogger(false) });
  }, 30_000);
  afterAll(async () => {
    await a?.close();
    await b?.close();
    await dsB?.destroy();
    await dropSchemaDataSource(dsA);
  });

  it('aborts the first run\'s LeaseSignal by the time its key is free and another instance runs it again', async () => {
    runs.length = 0;
    const key = randomUUID();
    const first = raw(a.url, '/work', { key, timeoutMs: 10_000 }).answer;
    while (runs.length === 0) await sleep(5);
    // Past the lease: the renewal of A is still queued for A's only pool connection.
    await sleep(LEASE_SECONDS * 1000 * 1.6);
    const duplicate = raw(b.url, '/work', { key, timeoutMs: 10_000 }).answer;
    await Promise.all([first, duplicate]);
    const counters = a.app.get(IdempotencyCounters);
    // The duplicate ran (the key had freed at the lease's end)...
    expect(runs.map((run) => run.instance)).toEqual(['A', 'B']);
    // ...and at that moment the first run had not been told its claim was lost.
    expect({ firstAbortedWhenSecondStarted: runs[1].othersAbortedAtStart[0], leasesLost: counters.leasesLost }).toEqual({
      firstAbortedWhenSecondStarted: true,
      leasesLost: 1,
    });
  }, 30_000);
});

describe('Redis that answers slower than the lease (the module\'s own client, commandTimeout 1 s)', () => {
  let proxy: TcpProxy;
  let a: EdgeApp;
  let b: EdgeApp;

  beforeAll(async () => {
    const { hostname, port } = new URL(REDIS_URL);
    proxy = await new TcpProxy({ host: hostname, port: Number(port) }).start();
    const providers = (name: string) => [{ provide: 'INSTANCE', useValue: name }];
    // A reaches Redis through the proxy, B directly: two app instances, one Redis.
    a = await makeApp('express', [SlowWorkController], { store: { redis: proxy.url } }, { providers: providers('A'), setup: (app) => app.useLogger(false) });
    b = await makeApp('express', [SlowWorkController], { store: { redis: REDIS_URL } }, { providers: providers('B'), setup: (app) => app.useLogger(false) });
  }, 30_000);
  afterAll(async () => {
    await a?.close();
    await b?.close();
    await proxy?.stop();
  });

  it('aborts the first run\'s LeaseSignal by the time its key is free and another instance runs it again', async () => {
    runs.length = 0;
    proxy.delayMs = 0;
    const key = randomUUID();
    const first = raw(a.url, '/slow', { key, timeoutMs: 10_000 }).answer;
    while (runs.length === 0) await sleep(5);
    proxy.delayMs = 900; // A's renewals now take 1.8 s round trip (they time out after 1 s)
    await sleep(LEASE_SECONDS * 1000 + 250);
    const duplicate = raw(b.url, '/slow', { key, timeoutMs: 10_000 }).answer;
    await Promise.all([first, duplicate]);
    expect(runs.map((run) => run.instance)).toEqual(['A', 'B']);
    expect(runs[1].othersAbortedAtStart[0]).toBe(true);
  }, 30_000);
});
