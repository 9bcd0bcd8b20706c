import { DataSource } from 'typeorm';
import * as library from '../../../libs/idempotency/src/typeorm/index.js';
import type { IdempotencyStore } from '../../../libs/idempotency/src/index.js';

/** Why an arm cannot run (yet); the driver shows it as a TODO row instead of failing the run. */
export class ArmUnavailable extends Error {
  override name = 'ArmUnavailable';
}

type StoreClass = new (dataSource: DataSource) => IdempotencyStore;
/** Looked up at run time: the bench also runs on a checkout from before the PostgreSQL store. */
const exported = library as unknown as Record<string, unknown>;

/** The PostgreSQL store's class, once the library exports it. */
export function postgresStoreClass(): StoreClass | undefined {
  return exported.PostgresIdempotencyStore as StoreClass | undefined;
}

function dataSourceOptions(url: string, schema: string, migrationsRun: boolean) {
  return {
    type: 'postgres' as const,
    url,
    schema,
    entities: exported.IDEMPOTENCY_ENTITIES as [],
    migrations: exported.IDEMPOTENCY_MIGRATIONS as [],
    migrationsRun,
    extra: { max: 20, connectionTimeoutMillis: 5000 },
  };
}

/**
 * The driver's part: a fresh schema with the library's tables (its migrations), made once before
 * the arms start so they never race on it. Returns a function that drops it.
 */
export async function preparePostgresSchema(url: string, schema: string): Promise<() => Promise<void>> {
  if (!postgresStoreClass()) {
    throw new ArmUnavailable('TODO: the library does not export PostgresIdempotencyStore yet (libs/idempotency/src/stores/postgres/)');
  }
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
  const Store = postgresStoreClass();
  if (!Store || !schema) {
    throw new ArmUnavailable('TODO: the library does not export PostgresIdempotencyStore yet (libs/idempotency/src/stores/postgres/)');
  }
  const dataSource = new DataSource(dataSourceOptions(url, schema, false));
  await dataSource.initialize();
  return new Store(dataSource);
}
