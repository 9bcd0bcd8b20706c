import { afterAll, describe, expect, it } from '@jest/globals';
import { DataSource } from 'typeorm';
import { DATABASE_URL } from '../../../../../test/support/services.js';
import { dropSchemaDataSource, openSchemaDataSource, testSchemaName } from '../../../../../test/support/test-schema.js';
import { IdempotencyConfigError } from '../../index.js';
import { IdempotencyRecords1764460800000 } from './idempotency-records.migration.js';
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

  it('checks nothing on a DataSource not initialized yet', async () => {
    const store = new PostgresIdempotencyStore(new DataSource({ type: 'postgres', url: DATABASE_URL }));
    await expect(store.onModuleInit()).resolves.toBeUndefined();
    await store.onApplicationShutdown();
  });
});
