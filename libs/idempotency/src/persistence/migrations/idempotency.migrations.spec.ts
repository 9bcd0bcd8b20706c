import { afterAll, beforeAll, describe, expect, it } from '@jest/globals';
import { randomUUID } from 'node:crypto';
import pg from 'pg';
import { DataSource } from 'typeorm';
import { DATABASE_URL } from '../../../../../test/support/services.js';
import { IDEMPOTENCY_ENTITIES } from '../idempotency.entities.js';
import { IDEMPOTENCY_MIGRATIONS } from './idempotency.migrations.js';

describe('IDEMPOTENCY_MIGRATIONS (PostgreSQL, custom schema)', () => {
  const schema = `test_${randomUUID().replace(/-/g, '').slice(0, 12)}`;
  let dataSource: DataSource;
  const tablesInSchema = async () =>
    (
      await dataSource.query(
        `SELECT table_name FROM information_schema.tables WHERE table_schema = $1 ORDER BY table_name`,
        [schema],
      )
    ).map((row: { table_name: string }) => row.table_name);

  beforeAll(async () => {
    const admin = new pg.Client({ connectionString: DATABASE_URL });
    await admin.connect();
    await admin.query(`CREATE SCHEMA "${schema}"`);
    await admin.end();
    dataSource = new DataSource({
      type: 'postgres',
      url: DATABASE_URL,
      schema,
      entities: IDEMPOTENCY_ENTITIES,
      migrations: IDEMPOTENCY_MIGRATIONS,
      migrationsRun: true,
    });
    await dataSource.initialize();
  });
  afterAll(async () => {
    await dataSource.query(`DROP SCHEMA "${schema}" CASCADE`);
    await dataSource.destroy();
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
