import { afterAll, beforeAll, describe, expect, it } from '@jest/globals';
import { createHash, randomUUID } from 'node:crypto';
import type { DataSource } from 'typeorm';
import { dropSchemaDataSource, openSchemaDataSource, testSchemaName } from '../../../../test/support/test-schema.js';
import { IDEMPOTENCY_ENTITIES } from './entities.js';
import { consumeOnce } from './helpers/consume-once.js';
import { IDEMPOTENCY_MIGRATIONS } from './migrations.js';
import { IDEMPOTENCY_OUTCOME_MIGRATIONS } from './outcomes/idempotency-outcomes.migration.js';
import { IDEMPOTENCY_OUTCOME_ENTITIES } from './outcomes/outcome-record.entity.js';
import { PostgresOutcomeRecorder } from './outcomes/postgres-outcome-recorder.js';
import { PostgresIdempotencyStore } from './store/postgres-idempotency.store.js';
import { IdempotentTransactions } from './transactional/idempotent-transactions.js';

// TypeORM's `entityPrefix` renames every entity's table. An adversarial helper: the migrations and
// the store kept the bare names while `consumeOnce` (through the entity) used the prefixed one,
// so with migrations no message could be consumed, and with `synchronize` every claim failed
// (and failed open: 150 parallel duplicates, 150 runs).
describe.each<[string, { migrations?: Function[]; migrationsRun?: boolean; synchronize?: boolean }]>([
  ['migrations', { migrations: [...IDEMPOTENCY_MIGRATIONS, ...IDEMPOTENCY_OUTCOME_MIGRATIONS], migrationsRun: true }],
  ['synchronize', { synchronize: true }],
])('an entityPrefix (%s): every part of the storage layer uses the prefixed tables', (_how, options) => {
  const schema = testSchemaName();
  let dataSource: DataSource;

  beforeAll(async () => {
    dataSource = await openSchemaDataSource(schema, { entities: [...IDEMPOTENCY_ENTITIES, ...IDEMPOTENCY_OUTCOME_ENTITIES], entityPrefix: 'app_', ...options });
  });
  afterAll(async () => {
    await dropSchemaDataSource(dataSource);
  });

  it('has the prefixed tables only', async () => {
    const tables = (await dataSource.query(`SELECT table_name FROM information_schema.tables WHERE table_schema = $1 ORDER BY table_name`, [schema])).map(
      (row: { table_name: string }) => row.table_name,
    );
    expect(tables.filter((name: string) => name !== 'migrations')).toEqual(['app_idempotency_consume_log', 'app_idempotency_outcomes', 'app_idempotency_records']);
  });

  it('the tables match the entities: the schema builder finds nothing to change', async () => {
    const pending = await dataSource.driver.createSchemaBuilder().log();
    expect(pending.upQueries.map((query) => query.query)).toEqual([]);
  });

  it('the store claims, completes and replays', async () => {
    const store = new PostgresIdempotencyStore(dataSource);
    const key = `prefix:${randomUUID()}`;
    expect(await store.claim({ key, token: 't1', fingerprint: 'fp', leaseMs: 10_000 })).toEqual({ status: 'acquired', token: 't1' });
    expect(await store.complete(key, 't1', { statusCode: 201, headers: {}, body: '{}' }, 60_000)).toBe(true);
    expect(await store.claim({ key, token: 't2', fingerprint: 'fp', leaseMs: 10_000 })).toMatchObject({ status: 'completed' });
  });

  it('consumeOnce processes a message once', async () => {
    const message = { consumer: 'billing', messageId: randomUUID() };
    expect(await consumeOnce(dataSource, message, async () => 1)).toEqual({ status: 'processed', result: 1 });
    expect(await consumeOnce(dataSource, message, async () => 2)).toMatchObject({ status: 'duplicate' });
  });

  it('IdempotentTransactions runs the work once', async () => {
    const transactions = new IdempotentTransactions(dataSource);
    const key = `tx:${randomUUID()}`;
    expect(await transactions.run({ key, fingerprint: 'fp' }, async () => ({ statusCode: 201, body: { ok: 1 } }))).toMatchObject({ status: 'ran' });
    expect(await transactions.run({ key, fingerprint: 'fp' }, async () => ({ statusCode: 201, body: { ok: 2 } }))).toMatchObject({ status: 'replayed', body: { ok: 1 } });
  });

  it('the outcome recorder claims and replays', async () => {
    const recorder = new PostgresOutcomeRecorder(dataSource);
    const input = { scope: 'uploads', requestId: randomUUID(), contentHash: createHash('sha256').update(randomUUID()).digest('hex') };
    const claim = await recorder.claim(input);
    expect(claim.status).toBe('acquired');
    if (claim.status !== 'acquired') return;
    expect(await recorder.succeed(claim.held, { statusCode: 201 })).toBe(true);
    expect(await recorder.claim(input)).toMatchObject({ status: 'success' });
  });
});
