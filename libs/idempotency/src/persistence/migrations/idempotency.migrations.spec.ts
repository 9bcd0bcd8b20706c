import { afterAll, beforeAll, describe, expect, it } from '@jest/globals';
import { DataSource } from 'typeorm';
import { IDEMPOTENCY_ENTITIES } from '../idempotency.entities.js';
import { IDEMPOTENCY_MIGRATIONS } from './idempotency.migrations.js';
import { dropSchemaDataSource, openSchemaDataSource, testSchemaName } from '../../../../../test/support/test-schema.js';

describe('IDEMPOTENCY_MIGRATIONS (PostgreSQL, custom schema)', () => {
  const schema = testSchemaName();
  let dataSource: DataSource;
  const tablesInSchema = async () =>
    (
      await dataSource.query(
        `SELECT table_name FROM information_schema.tables WHERE table_schema = $1 ORDER BY table_name`,
        [schema],
      )
    ).map((row: { table_name: string }) => row.table_name);

  beforeAll(async () => {
    dataSource = await openSchemaDataSource(schema, {
      entities: IDEMPOTENCY_ENTITIES,
      migrations: IDEMPOTENCY_MIGRATIONS,
      migrationsRun: true,
    });
  });
  afterAll(async () => {
    await dropSchemaDataSource(dataSource);
  });

  it('creates both tables in the DataSource schema at start-up, and records the migrations there', async () => {
    expect(await tablesInSchema()).toEqual(['idempotency_consume_log', 'idempotency_records', 'migrations']);
    const ran = await dataSource.query(`SELECT name FROM "${schema}".migrations ORDER BY id`);
    expect(ran.map((row: { name: string }) => row.name)).toEqual([
      'IdempotencyRecords1764460800000',
      'IdempotencyConsumeLog1764460800001',
    ]);
  });

  it('matches the entities exactly: the schema builder finds nothing to change', async () => {
    const pending = await dataSource.driver.createSchemaBuilder().log();
    expect(pending.upQueries.map((query) => query.query)).toEqual([]);
  });

  it('creates the expiry index the purge scans by', async () => {
    const indexes = await dataSource.query(`SELECT indexname FROM pg_indexes WHERE schemaname = $1 AND tablename = 'idempotency_records'`, [
      schema,
    ]);
    expect(indexes.map((row: { indexname: string }) => row.indexname).sort()).toEqual([
      'idx_idempotency_records_expires_at',
      'pk_idempotency_records',
    ]);
  });

  it('drops the tables on the way down, and creates them again on the way up', async () => {
    await dataSource.undoLastMigration();
    await dataSource.undoLastMigration();
    expect(await tablesInSchema()).toEqual(['migrations']);
    expect(await dataSource.runMigrations()).toHaveLength(2);
    expect(await tablesInSchema()).toEqual(['idempotency_consume_log', 'idempotency_records', 'migrations']);
  });
});
