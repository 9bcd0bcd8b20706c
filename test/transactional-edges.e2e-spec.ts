// Adversarial review of IdempotentTransactions: pool exhaustion, nested transactions, bodies JSON
// cannot hold, an expired record taken over while a duplicate waits, a key shared with the
// guard's PostgresIdempotencyStore, two instances (DataSources) on one database.
import { afterAll, beforeAll, describe, expect, it } from '@jest/globals';
import { randomUUID } from 'node:crypto';
import type { DataSource, EntityManager } from 'typeorm';
import {
  IDEMPOTENCY_MIGRATIONS,
  IdempotentTransactions,
  PostgresIdempotencyStore,
  type IdempotentRunResult,
} from '../libs/idempotency/src/typeorm/index.js';
import { sleep } from './support/edge-app.js';
import { dropSchemaDataSource, openSchemaDataSource, testSchemaName } from './support/test-schema.js';
import { DATABASE_URL } from './support/services.js';
import { DataSource as TypeOrmDataSource } from 'typeorm';
import type { PostgresDataSourceOptions } from 'typeorm/driver/postgres/PostgresDataSourceOptions.js';

let ds: DataSource;
let schema: string;
const extra: DataSource[] = [];

async function openExtra(poolSize: number): Promise<DataSource> {
  const source = new TypeOrmDataSource({ type: 'postgres', url: DATABASE_URL, schema, extra: { max: poolSize } } as PostgresDataSourceOptions);
  await source.initialize();
  extra.push(source);
  return source;
}

const effects = async (key: string) =>
  Number((await ds.query(`SELECT count(*)::int AS n FROM "${schema}".effects WHERE k = $1`, [key]))[0].n);
const effect = (manager: EntityManager, key: string) => manager.query(`INSERT INTO "${schema}".effects (k) VALUES ($1)`, [key]);

beforeAll(async () => {
  schema = testSchemaName();
  ds = await openSchemaDataSource(schema, { migrations: IDEMPOTENCY_MIGRATIONS, migrationsRun: true, extra: { max: 2 } });
  await ds.query(`CREATE TABLE "${schema}".effects (id serial PRIMARY KEY, k text NOT NULL)`);
});
afterAll(async () => {
  for (const source of extra) await source.destroy();
  await dropSchemaDataSource(ds);
});


/**
 * Resolved by a work as its first step: `run()` calls the work once the claim's row is written and
 * locked, so a duplicate sent after it meets the claim, however slow the machine (a fixed sleep
 * raced the claim's round trips).
 */
function started(): { promise: Promise<void>; resolve: () => void } {
  let resolve!: () => void;
  const promise = new Promise<void>((done) => (resolve = done));
  return { promise, resolve };
}
describe('IdempotentTransactions under review', () => {
  it('50 concurrent duplicates on a pool of 2: one effect, everyone answered, no deadlock', async () => {
    const tx = new IdempotentTransactions(ds, { lockTimeoutMs: 3000 });
    const key = `review:${randomUUID()}`;
    const started = Date.now();
    const results = await Promise.all(
      Array.from({ length: 50 }, () =>
        tx.run({ key }, async (manager) => {
          await effect(manager, key);
          await sleep(200);
          return { statusCode: 201, body: { ok: true } };
        }),
      ),
    );
    const by = (s: string) => results.filter((r) => r.status === s).length;
    expect({ ran: by('ran'), effects: await effects(key) }).toEqual({ ran: 1, effects: 1 });
    expect(by('ran') + by('replayed') + by('in_progress')).toBe(50);
    expect(Date.now() - started).toBeLessThan(15000);
  }, 30000);

  it('a work that opens a nested manager.transaction (savepoint), one failing and caught: one commit', async () => {
    const tx = new IdempotentTransactions(ds);
    const key = `review:${randomUUID()}`;
    const first = await tx.run({ key }, async (manager) => {
      await manager.transaction(async (inner) => effect(inner, key));
      await manager
        .transaction(async (inner) => {
          await effect(inner, key);
          throw new Error('inner fails');
        })
        .catch(() => undefined);
      return { body: { n: 1 } };
    });
    const again = await tx.run({ key }, async () => ({ body: { n: 2 } }));
    expect({ first: first.status, again, effects: await effects(key) }).toEqual({
      first: 'ran',
      again: { status: 'replayed', statusCode: 200, body: { n: 1 } },
      effects: 1,
    });
  });

  it('a body JSON cannot hold (BigInt, circular) rolls everything back and frees the key', async () => {
    const tx = new IdempotentTransactions(ds);
    for (const body of [{ big: 1n }, (() => { const o: Record<string, unknown> = {}; o.self = o; return o; })()]) {
      const key = `review:${randomUUID()}`;
      await expect(tx.run({ key }, async (manager) => { await effect(manager, key); return { body }; })).rejects.toThrow(TypeError);
      const retry = await tx.run({ key }, async (manager) => { await effect(manager, key); return { body: 'ok' }; });
      expect({ retry: retry.status, effects: await effects(key) }).toEqual({ retry: 'ran', effects: 1 });
    }
  });

  it('a work that changes lock_timeout for its session does not change how long the next duplicate waits', async () => {
    const tx = new IdempotentTransactions(ds, { lockTimeoutMs: 1500 });
    // Poison both pooled connections with a session-level lock_timeout of 1 ms.
    await Promise.all(
      [1, 2].map((i) => tx.run({ key: `review:${randomUUID()}:${i}` }, async (manager) => {
        await manager.query(`SET lock_timeout = '1ms'`);
        await sleep(50);
        return { body: i };
      })),
    );
    const key = `review:${randomUUID()}`;
    const holding = started();
    const holder = tx.run({ key }, async (manager) => { holding.resolve(); await effect(manager, key); await sleep(600); return { body: 'first' }; });
    await holding.promise;
    const duplicate = await tx.run({ key }, async () => ({ body: 'second' }));
    await holder;
    // The duplicate should wait (lockTimeoutMs 1500 > 500 left) and replay.
    expect(duplicate).toEqual({ status: 'replayed', statusCode: 200, body: 'first' });
    await ds.query(`SET lock_timeout = 0`);
  });

  it('an expired record taken over while a duplicate waits: the duplicate replays the new answer, two effects in all', async () => {
    const tx = new IdempotentTransactions(ds, { retentionMs: 200 });
    const key = `review:${randomUUID()}`;
    await tx.run({ key }, async (manager) => { await effect(manager, key); return { body: 'old' }; });
    await sleep(400);
    const taking = started();
    const takeover = tx.run({ key }, async (manager) => { taking.resolve(); await effect(manager, key); await sleep(500); return { body: 'new' }; });
    await taking.promise;
    const waiting = await tx.run({ key }, async (manager) => { await effect(manager, key); return { body: 'dup' }; });
    expect({ takeover: await takeover, waiting, effects: await effects(key) }).toEqual({
      takeover: { status: 'ran', statusCode: 200, body: 'new' },
      waiting: { status: 'replayed', statusCode: 200, body: 'new' },
      effects: 2,
    });
  });

  it("a key shared with the guard's store under load: the store's claims wait and see the run's answer, or see it in progress", async () => {
    const store = new PostgresIdempotencyStore(ds);
    const tx = new IdempotentTransactions(ds);
    const key = `review:${randomUUID()}`;
    const running = started();
    const run = tx.run({ key }, async (manager) => { running.resolve(); await effect(manager, key); await sleep(400); return { statusCode: 201, body: { paid: 1 } }; });
    await running.promise;
    const claims = await Promise.all(
      Array.from({ length: 10 }, () => store.claim({ key, token: randomUUID(), fingerprint: '', leaseMs: 5000 })),
    );
    await run;
    expect(claims.filter((c) => c.status === 'acquired')).toHaveLength(0);
    const completed = claims.find((c) => c.status === 'completed') as { response: { statusCode: number; body?: string } } | undefined;
    if (completed) expect({ status: completed.response.statusCode, body: completed.response.body }).toEqual({ status: 201, body: '{"paid":1}' });
    expect(await effects(key)).toBe(1);
  });

  it('two instances (DataSources of 2 connections) on one database, 50 parallel identical payments: one effect', async () => {
    const a = new IdempotentTransactions(await openExtra(2));
    const b = new IdempotentTransactions(await openExtra(2));
    const key = `payments:u1:${randomUUID()}`;
    const results: IdempotentRunResult<unknown>[] = await Promise.all(
      Array.from({ length: 50 }, (_, i) =>
        (i % 2 ? a : b).run({ key, fingerprint: 'fp' }, async (manager) => {
          await effect(manager, key);
          await sleep(100);
          return { statusCode: 201, body: { id: 1 } };
        }),
      ),
    );
    expect({ ran: results.filter((r) => r.status === 'ran').length, effects: await effects(key) }).toEqual({ ran: 1, effects: 1 });
    expect(results.filter((r) => r.status === 'mismatch')).toHaveLength(0);
  }, 30000);

  it('a very long key (100 kB) runs once and replays', async () => {
    const tx = new IdempotentTransactions(ds);
    const key = `review:${'k'.repeat(100_000)}:${randomUUID()}`;
    const first = await tx.run({ key }, async (manager) => { await effect(manager, 'long'); return { body: 1 }; });
    const again = await tx.run({ key }, async () => ({ body: 2 }));
    expect([first.status, again.status]).toEqual(['ran', 'replayed']);
  });
});
