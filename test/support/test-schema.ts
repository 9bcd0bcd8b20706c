import { randomUUID } from 'node:crypto';
import pg from 'pg';
import { DataSource } from 'typeorm';
import type { PostgresDataSourceOptions } from 'typeorm/driver/postgres/PostgresDataSourceOptions.js';
import { DATABASE_URL } from './services.js';

/** A fresh schema name, so that each spec has its tables to itself in the shared database. */
export const testSchemaName = (): string => `test_${randomUUID().replace(/-/g, '').slice(0, 12)}`;

/** Runs one statement on its own connection: schemas made and dropped outside any DataSource, a migration or another instance in a test. */
export async function adminQuery(sql: string): Promise<void> {
  const admin = new pg.Client({ connectionString: DATABASE_URL });
  await admin.connect();
  try {
    await admin.query(sql);
  } finally {
    await admin.end();
  }
}

export const createTestSchema = (schema: string) => adminQuery(`CREATE SCHEMA "${schema}"`);
export const dropTestSchema = (schema: string) => adminQuery(`DROP SCHEMA IF EXISTS "${schema}" CASCADE`);

/**
 * Creates `schema` and opens a DataSource on it (`synchronize` or `migrationsRun` as the options
 * say): the schema exists before TypeORM builds anything in it.
 */
export async function openSchemaDataSource(
  schema: string,
  options: Omit<PostgresDataSourceOptions, 'type' | 'url' | 'schema'>,
): Promise<DataSource> {
  await createTestSchema(schema);
  const dataSource = new DataSource({ type: 'postgres', url: DATABASE_URL, schema, ...options });
  await dataSource.initialize();
  return dataSource;
}

/** Drops the DataSource's schema with everything in it, and closes the DataSource. */
export async function dropSchemaDataSource(dataSource: DataSource | undefined): Promise<void> {
  if (!dataSource) return;
  const { schema } = dataSource.options as PostgresDataSourceOptions;
  await dataSource.query(`DROP SCHEMA "${schema}" CASCADE`);
  await dataSource.destroy();
}
