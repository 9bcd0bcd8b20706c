// A burst on a small pool the handlers share with the PostgreSQL store: the claims, renewals and
// saves wait in the pool's queue behind the handlers' own queries, and a save landed after its
// lease. The store refused it (a stale owner), nothing was saved, the first caller still had its
// 201, and the retry ran the handler again: an adversarial helper saw 100 of 100 keys run twice
// (pool 2, 300 ms transactions, a healthy database). Nobody had claimed those keys since: the
// guard now claims the key again with the run's own token and saves the answer.
import { afterAll, beforeAll, describe, expect, it } from '@jest/globals';
import { Controller, Inject, Post } from '@nestjs/common';
import { randomUUID } from 'node:crypto';
import type { DataSource } from 'typeorm';
import { NoRepeatSubmit } from '../libs/idempotency/src/index.js';
import { IDEMPOTENCY_ENTITIES, IDEMPOTENCY_MIGRATIONS, PostgresIdempotencyStore } from '../libs/idempotency/src/typeorm/index.js';
import { makeApp, send, type EdgeApp } from './support/edge-app.js';
import { dropSchemaDataSource, openSchemaDataSource, testSchemaName } from './support/test-schema.js';

let ran = 0;

@Controller('bookings')
class BookingsController {
  constructor(@Inject('DS') private readonly ds: DataSource) {}

  /** A short transaction on the app's own pool, as handlers do. */
  @Post()
  @NoRepeatSubmit({ leaseSeconds: 1 })
  async book() {
    ran++;
    await this.ds.query('SELECT pg_sleep(0.15)');
    return { booked: true };
  }
}

describe('saves that land after their lease on a busy pool (PostgreSQL store, pool of 2)', () => {
  const schema = testSchemaName();
  let ds: DataSource;
  let app: EdgeApp;

  beforeAll(async () => {
    ds = await openSchemaDataSource(schema, { entities: IDEMPOTENCY_ENTITIES, migrations: IDEMPOTENCY_MIGRATIONS, migrationsRun: true, extra: { max: 2 } });
    app = await makeApp('express', [BookingsController], { store: new PostgresIdempotencyStore(ds), keyPrefix: 'late-save' }, {
      providers: [{ provide: 'DS', useValue: ds }],
    });
    app.app.useLogger(false);
  });
  afterAll(async () => {
    await app?.close();
    await dropSchemaDataSource(ds);
  });

  it('runs each key once: a retry after every answer is back replays it', async () => {
    const keys = Array.from({ length: 30 }, () => randomUUID());
    // 30 handlers of 150 ms on 2 connections: ~2.3 s of queue, past the 1 s lease.
    const first = await Promise.all(keys.map((key) => send(app.url, '/bookings', { key, timeoutMs: 20_000 })));
    expect(first.map((answer) => answer.status)).toEqual(keys.map(() => 201));
    const retries = await Promise.all(keys.map((key) => send(app.url, '/bookings', { key, timeoutMs: 20_000 })));
    // Observed before: 26 of 30 keys ran again (their retries answered by a new run, not replayed).
    expect(retries.filter((answer) => answer.headers['idempotent-replayed'] !== 'true')).toHaveLength(0);
    expect(ran).toBe(30);
  });
});
