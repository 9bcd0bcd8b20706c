import { DataSource } from 'typeorm';
import type { IdempotencyStore } from '../../../libs/idempotency/src/index.js';
import {
  IDEMPOTENCY_ENTITIES,
  IDEMPOTENCY_MIGRATIONS,
  PostgresIdempotencyStore,
} from '../../../libs/idempotency/src/typeorm/index.js';

/** Why an arm cannot run; the driver shows it as a row of its own instead of failing the run. */
export class ArmUnavailable extends Error {
  override name = 'ArmUnavailable';
}

function dataSourceOptions(url: string, schema: string, migrationsRun: boolean) {
  return {
    type: 'postgres' as const,
    url,
    schema,
    entities: IDEMPOTENCY_ENTITIES,
    migrations: IDEMPOTENCY_MIGRATIONS,
    migrationsRun,
    extra: { max: 20, connectionTimeoutMillis: 5000 },
  };
}

/**
 * The driver's part: a fresh schema with the library's tables (its migrations), made once before
 * the arms start so they never race on it. Returns a function that drops it.
 */
export async function preparePostgresSchema(url: string, schema: string): Promise<() => Promise<void>> {
  const admin = new DataSource({ type: 'postgres', url, extra: { connectionTimeoutMillis: 5000 } });
  await admin.initialize();
  await admin.query(`CREATE SCHEMA IF NOT EXISTS "${schema}"`);
  await admin.destroy();
  const migrate = new DataSource(dataSourceOptions(url, schema, true));
  await migrate.initialize();
  await migrate.destroy();
  return async () => {
    const drop = new DataSource({ type: 'postgres', url });
    await drop.initialize();
    await drop.query(`DROP SCHEMA IF EXISTS "${schema}" CASCADE`);
    await drop.destroy();
  };
}

/** The arm's part: `PostgresIdempotencyStore` on its own DataSource (pool of 20). */
export async function createPostgresStore(url: string, schema: string | undefined): Promise<IdempotencyStore> {
  if (!schema) throw new ArmUnavailable('the PostgreSQL arm needs the schema the driver prepared');
  const dataSource = new DataSource(dataSourceOptions(url, schema, false));
  await dataSource.initialize();
  return new PostgresIdempotencyStore(dataSource);
}
