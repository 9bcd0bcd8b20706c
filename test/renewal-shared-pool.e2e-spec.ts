// The PostgreSQL store on the app's own DataSource, a small pool its handlers use too: each
// handler holds a connection a short while (a transaction of 150 ms, far under the lease). The
// handlers' queries queue for the pool; a held claim's renewal moves forward, taking turns with
// them, so with many claims held their renewals waited behind as many handler transactions:
// the last ones missed the lease, and a duplicate whose claim was served then took the key and
// ran the handler again (an adversarial helper: a pool of 2, 0.4 s transactions, 60 keys, 1 to 3
// keys ran twice in 2 of 3 runs, with the default 10 s lease; the README's condition, handlers
// holding connections longer than a lease, was not met). The renewals of the claims a process
// holds now go out together, in one statement, whenever it gets a connection.
import { afterAll, beforeAll, describe, expect, it } from '@jest/globals';
import { Controller, Headers, Post } from '@nestjs/common';
import { randomUUID } from 'node:crypto';
import { DataSource } from 'typeorm';
import { NoRepeatSubmit } from '../libs/idempotency/src/index.js';
import { IDEMPOTENCY_ENTITIES, IDEMPOTENCY_MIGRATIONS, PostgresIdempotencyStore } from '../libs/idempotency/src/typeorm/index.js';
import { makeApp, send, sleep, type EdgeApp } from './support/edge-app.js';
import { DATABASE_URL } from './support/services.js';
import { dropSchemaDataSource, openSchemaDataSource, testSchemaName } from './support/test-schema.js';

const runsOf = new Map<string, number>();
let ds: DataSource;

@Controller('orders')
class OrdersController {
  @Post()
  @NoRepeatSubmit({ leaseSeconds: 2 })
  async create(@Headers('idempotency-key') key: string) {
    runsOf.set(key, (runsOf.get(key) ?? 0) + 1);
    await ds.transaction((manager) => manager.query('SELECT pg_sleep(0.15)'));
    return { created: key };
  }
}

describe('renewals on a pool the handlers share (PostgreSQL store, pool of 2)', () => {
  const schema = testSchemaName();
  let setup: DataSource;
  let app: EdgeApp;

  beforeAll(async () => {
    setup = await openSchemaDataSource(schema, { entities: IDEMPOTENCY_ENTITIES, migrations: IDEMPOTENCY_MIGRATIONS, migrationsRun: true, extra: { max: 1 } });
    ds = new DataSource({ type: 'postgres', url: DATABASE_URL, schema, entities: IDEMPOTENCY_ENTITIES, extra: { max: 2 } });
    await ds.initialize();
    app = await makeApp('express', [OrdersController], { store: new PostgresIdempotencyStore(ds), keyPrefix: 'renewal-shared-pool' });
    app.app.useLogger(false);
  });
  afterAll(async () => {
    await app?.close();
    await ds?.destroy();
    await dropSchemaDataSource(setup);
  });

  it('keeps every held claim while 40 handler transactions of 150 ms queue for 2 connections (3 s of work, 2 s leases): each key runs once', async () => {
    const keys = Array.from({ length: 40 }, () => randomUUID());
    const firsts = keys.map((key) => send(app.url, '/orders', { key, timeoutMs: 60_000 }));
    await sleep(300); // the claims landed; the handlers' transactions queue for the pool
    // A duplicate of each, retried while in progress: its claims queue behind the handlers' work.
    const duplicate = async (key: string) => {
      for (let attempt = 0; attempt < 400; attempt++) {
        const answer = await send(app.url, '/orders', { key, timeoutMs: 60_000 });
        if (answer.status !== 409) return answer.status;
        await sleep(100);
      }
      return 409;
    };
    const duplicates = keys.map((key) => duplicate(key));
    expect((await Promise.all(firsts)).map((answer) => answer.status)).toEqual(keys.map(() => 201));
    await Promise.all(duplicates);
    expect(keys.filter((key) => runsOf.get(key) !== 1).map((key) => runsOf.get(key))).toEqual([]);
  });
});

// A renewal that waited for a connection counted its lease from when it was asked for, not from
// when its statement went out (and the database counted it from): the claim was taken for lost
// one wait before its lease ended in the database, no more renewals went, and a duplicate took
// the key and ran the handler again (an adversarial helper: a pool of 3 shared with 0.7 s
// handler transactions, 1 s leases, 15 to 39 of 60 to 140 keys ran twice, and later duplicates
// got the second run's answer). Here the pool's one connection is kept busy by 0.6 s statements,
// back to back: each renewal waits for one to end (it goes ahead of the next).
const slowRuns = new Map<string, number>();

@Controller('slow')
class SlowController {
  @Post()
  @NoRepeatSubmit({ leaseSeconds: 1 })
  async create(@Headers('idempotency-key') key: string) {
    slowRuns.set(key, (slowRuns.get(key) ?? 0) + 1);
    await sleep(3_500);
    return { created: key, run: randomUUID() };
  }
}

describe('a renewal that waits for the connection of a busy pool (PostgreSQL store, pool of 1)', () => {
  const schema = testSchemaName();
  let setup: DataSource;
  let busy: DataSource;
  let app: EdgeApp;

  beforeAll(async () => {
    setup = await openSchemaDataSource(schema, { entities: IDEMPOTENCY_ENTITIES, migrations: IDEMPOTENCY_MIGRATIONS, migrationsRun: true, extra: { max: 1 } });
    busy = new DataSource({ type: 'postgres', url: DATABASE_URL, schema, entities: IDEMPOTENCY_ENTITIES, extra: { max: 1 } });
    await busy.initialize();
    app = await makeApp('express', [SlowController], { store: new PostgresIdempotencyStore(busy), keyPrefix: 'renewal-busy-pool' });
    app.app.useLogger(false);
  });
  afterAll(async () => {
    await app?.close();
    await busy?.destroy();
    await dropSchemaDataSource(setup);
  });

  it('counts each lease from when its renewal went out: a 3.5 s handler on 1 s leases keeps its key, duplicates get 409 then its answer', async () => {
    let stopped = false;
    const load = (async () => {
      while (!stopped) await busy.query('SELECT pg_sleep(0.6)');
    })();
    try {
      const key = randomUUID();
      const first = send(app.url, '/slow', { key, timeoutMs: 30_000 });
      const statuses: number[] = [];
      for (let i = 0; i < 6; i++) {
        await sleep(500);
        statuses.push((await send(app.url, '/slow', { key, timeoutMs: 30_000 })).status);
      }
      const answer = await first;
      stopped = true;
      await load;
      const again = await send(app.url, '/slow', { key, timeoutMs: 30_000 });
      expect({ runs: slowRuns.get(key), statuses: [...new Set(statuses)] }).toEqual({ runs: 1, statuses: [409] });
      expect([again.status, again.headers['idempotent-replayed'], again.text]).toEqual([201, 'true', answer.text]);
    } finally {
      stopped = true;
      await load;
    }
  });
});

