import { afterAll, beforeAll, describe, expect, it } from '@jest/globals';
import { DataSource } from 'typeorm';
import { PostgresIdempotencyStore } from './store/postgres-idempotency.store.js';
import { IDEMPOTENCY_ENTITIES } from './entities.js';
import { IDEMPOTENCY_MIGRATIONS } from './migrations.js';
import { dropSchemaDataSource, openSchemaDataSource, testSchemaName } from '../../../../test/support/test-schema.js';

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
      'IdempotencyResponseFlags1795996800002',
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

  it('adds the response flags to a table that holds records, which then read back without them', async () => {
    const columns = async () =>
      (
        await dataSource.query(
          `SELECT column_name FROM information_schema.columns WHERE table_schema = $1 AND table_name = 'idempotency_records'`,
          [schema],
        )
      ).map((row: { column_name: string }) => row.column_name);
    await dataSource.undoLastMigration();
    expect(await columns()).not.toContain('body_encoding');
    await dataSource.query(
      `INSERT INTO "${schema}".idempotency_records (key, state, token, fingerprint, status_code, headers, body, has_body, expires_at)
       VALUES ('before', 'completed', 't', 'fp', 201, '{}', '{"id":1}', true, now() + interval '1 hour')`,
    );
    expect(await dataSource.runMigrations()).toHaveLength(1);
    expect(await columns()).toEqual(expect.arrayContaining(['body_encoding', 'unreplayable']));
    const store = new PostgresIdempotencyStore(dataSource);
    expect((await store.get('before'))?.response).toStrictEqual({ statusCode: 201, headers: {}, body: '{"id":1}' });
    await dataSource.query(`DELETE FROM "${schema}".idempotency_records`);
  });

  it('drops the tables on the way down, and creates them again on the way up', async () => {
    await dataSource.undoLastMigration();
    await dataSource.undoLastMigration();
    await dataSource.undoLastMigration();
    expect(await tablesInSchema()).toEqual(['migrations']);
    expect(await dataSource.runMigrations()).toHaveLength(3);
    expect(await tablesInSchema()).toEqual(['idempotency_consume_log', 'idempotency_records', 'migrations']);
  });
});
