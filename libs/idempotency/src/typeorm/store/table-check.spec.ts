import { afterAll, describe, expect, it } from '@jest/globals';
import { DataSource } from 'typeorm';
import { DATABASE_URL } from '../../../../../test/support/services.js';
import { dropSchemaDataSource, openSchemaDataSource, testSchemaName } from '../../../../../test/support/test-schema.js';
import { IdempotencyConfigError } from '../../index.js';
import { IdempotencyRecords1764460800000 } from './idempotency-records.migration.js';
import { IdempotencyResponseFlags1795996800002 } from './idempotency-response-flags.migration.js';
import { PostgresIdempotencyStore } from './postgres-idempotency.store.js';

// An adversarial helper: a store whose table was missing (migrations not run, or run under
// another name) started, failed every claim, and so failed open: 150 parallel duplicates, 150 runs.
describe('PostgresIdempotencyStore checks its table at start-up', () => {
  const schemas: DataSource[] = [];
  const open = async (options: Parameters<typeof openSchemaDataSource>[1]) => {
    const dataSource = await openSchemaDataSource(testSchemaName(), options);
    schemas.push(dataSource);
    return dataSource;
  };

  afterAll(async () => {
    await Promise.all(schemas.map((dataSource) => dropSchemaDataSource(dataSource)));
  });

  it('refuses to start without its table, naming it and the migrations', async () => {
    const dataSource = await open({});
    const store = new PostgresIdempotencyStore(dataSource);
    await expect(store.onModuleInit()).rejects.toThrow(IdempotencyConfigError);
    await expect(store.onModuleInit()).rejects.toThrow(/"idempotency_records" .*IDEMPOTENCY_MIGRATIONS/);
  });

  it('refuses a table that lacks a later migration\'s columns', async () => {
    const dataSource = await open({ migrations: [IdempotencyRecords1764460800000], migrationsRun: true });
    await expect(new PostgresIdempotencyStore(dataSource).onModuleInit()).rejects.toThrow(/body_encoding.*IDEMPOTENCY_MIGRATIONS/);
  });

  it('refuses a tableName that names no table', async () => {
    const dataSource = await open({ migrations: [IdempotencyRecords1764460800000], migrationsRun: true });
    await expect(new PostgresIdempotencyStore(dataSource, { tableName: 'nowhere.records' }).onModuleInit()).rejects.toThrow(/"nowhere"\."records"/);
  });

  it('refuses a table whose "key" has no unique index', async () => {
    const dataSource = await open({ migrations: [IdempotencyRecords1764460800000, IdempotencyResponseFlags1795996800002], migrationsRun: true });
    const { schema } = dataSource.options as { schema: string };
    await dataSource.query(`ALTER TABLE "${schema}".idempotency_records DROP CONSTRAINT pk_idempotency_records`);
    await expect(new PostgresIdempotencyStore(dataSource).onModuleInit()).rejects.toThrow(/no unique index/);
  });

  it('refuses a read-only session (a replica)', async () => {
    const migrated = await open({ migrations: [IdempotencyRecords1764460800000, IdempotencyResponseFlags1795996800002], migrationsRun: true });
    const { schema } = migrated.options as { schema: string };
    const replica = new DataSource({ type: 'postgres', url: DATABASE_URL, schema, extra: { options: '-c default_transaction_read_only=on' } });
    await replica.initialize();
    try {
      await expect(new PostgresIdempotencyStore(replica).onModuleInit()).rejects.toThrow(/read-only/);
    } finally {
      await replica.destroy();
    }
  });

  it('refuses a role that may only read the table, or not even that', async () => {
    const migrated = await open({ migrations: [IdempotencyRecords1764460800000, IdempotencyResponseFlags1795996800002], migrationsRun: true });
    const { schema } = migrated.options as { schema: string };
    const role = `idem_ro_${schema.slice(-8)}`;
    await migrated.query(`CREATE ROLE ${role} LOGIN`);
    await migrated.query(`GRANT USAGE ON SCHEMA "${schema}" TO ${role}`);
    const url = new URL(DATABASE_URL);
    url.username = role;
    url.password = '';
    const asRole = new DataSource({ type: 'postgres', url: url.toString(), schema });
    await asRole.initialize();
    try {
      await expect(new PostgresIdempotencyStore(asRole).onModuleInit()).rejects.toThrow(/permission denied/);
      await migrated.query(`GRANT SELECT ON "${schema}".idempotency_records TO ${role}`);
      await expect(new PostgresIdempotencyStore(asRole).onModuleInit()).rejects.toThrow(/lacks SELECT, INSERT, UPDATE or DELETE/);
    } finally {
      await asRole.destroy();
      await migrated.query(`DROP OWNED BY ${role}`);
      await migrated.query(`DROP ROLE ${role}`);
    }
  });

  it('checks nothing on a DataSource not initialized yet', async () => {
    const store = new PostgresIdempotencyStore(new DataSource({ type: 'postgres', url: DATABASE_URL }));
    await expect(store.onModuleInit()).resolves.toBeUndefined();
    await store.onApplicationShutdown();
  });
});
