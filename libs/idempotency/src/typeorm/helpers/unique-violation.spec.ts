import { afterAll, beforeAll, describe, expect, it } from '@jest/globals';
import pg from 'pg';
import { Column, DataSource, Entity, Index, PrimaryGeneratedColumn, QueryFailedError } from 'typeorm';
import { DATABASE_URL } from '../../../../../test/support/services.js';
import { uniqueViolationOf } from './unique-violation.js';
import { dropSchemaDataSource, openSchemaDataSource, testSchemaName } from '../../../../../test/support/test-schema.js';

@Entity({ name: 'gadgets' })
@Index('uq_gadgets_serial', ['serial'], { unique: true })
class Gadget {
  @PrimaryGeneratedColumn()
  id!: number;

  @Column({ type: 'varchar', length: 32 })
  serial!: string;

  @Column({ type: 'varchar', length: 32 })
  name!: string;
}

describe('uniqueViolationOf on PostgreSQL (real)', () => {
  const schema = testSchemaName();
  let dataSource: DataSource;

  beforeAll(async () => {
    dataSource = await openSchemaDataSource(schema, { entities: [Gadget], synchronize: true });
    await dataSource.getRepository(Gadget).insert({ serial: 'S-1', name: 'first' });
  });
  afterAll(async () => {
    await dropSchemaDataSource(dataSource);
  });

  it('names the constraint of a QueryFailedError from a duplicate insert', async () => {
    const error = await dataSource
      .getRepository(Gadget)
      .insert({ serial: 'S-1', name: 'again' })
      .catch((e: unknown) => e);
    expect(error).toBeInstanceOf(QueryFailedError);
    expect(uniqueViolationOf(error)).toEqual({
      driver: 'postgres',
      constraint: 'uq_gadgets_serial',
      table: 'gadgets',
      detail: 'Key (serial)=(S-1) already exists.',
    });
  });

  it('recognises the raw pg error too', async () => {
    const client = new pg.Client({ connectionString: DATABASE_URL });
    await client.connect();
    try {
      const error = await client
        .query(`INSERT INTO "${schema}".gadgets (serial, name) VALUES ('S-1', 'raw')`)
        .catch((e: unknown) => e);
      expect(error).not.toBeInstanceOf(QueryFailedError);
      expect(uniqueViolationOf(error)).toMatchObject({ driver: 'postgres', constraint: 'uq_gadgets_serial' });
    } finally {
      await client.end();
    }
  });

  it('ignores other database errors (a NOT NULL violation) and non-errors', async () => {
    const error = await dataSource
      .getRepository(Gadget)
      .insert({ serial: 'S-2', name: null as unknown as string })
      .catch((e: unknown) => e);
    expect((error as QueryFailedError<Error & { code: string }>).driverError.code).toBe('23502');
    expect(uniqueViolationOf(error)).toBeUndefined();
    expect(uniqueViolationOf(new Error('boom'))).toBeUndefined();
    expect(uniqueViolationOf(undefined)).toBeUndefined();
    expect(uniqueViolationOf('23505')).toBeUndefined();
  });
});

/**
 * MySQL/MariaDB and SQLite are not run here (their drivers are not installed): these errors are
 * shaped like the ones mysql2 and better-sqlite3 throw, wrapped the way TypeORM wraps them.
 */
describe('uniqueViolationOf on MySQL and SQLite (driver-shaped errors)', () => {
  const mysqlError = (message: string) =>
    Object.assign(new Error(message), { code: 'ER_DUP_ENTRY', errno: 1062, sqlState: '23000', sqlMessage: message });
  class SqliteError extends Error {
    constructor(
      message: string,
      readonly code: string,
    ) {
      super(message);
      this.name = 'SqliteError';
    }
  }
  const wrap = (driverError: Error) => new QueryFailedError('INSERT INTO ...', [], driverError);

  it('reads the key name MySQL 8 prefixes with the table', () => {
    const error = wrap(mysqlError("Duplicate entry 'A-1' for key 'orders.uq_orders_order_no'"));
    expect(uniqueViolationOf(error)).toEqual({
      driver: 'mysql',
      constraint: 'uq_orders_order_no',
      table: 'orders',
      detail: "Duplicate entry 'A-1' for key 'orders.uq_orders_order_no'",
    });
  });

  it("reads MariaDB's bare key name, with quotes inside the entry, raw or wrapped", () => {
    const raw = mysqlError("Duplicate entry 'it's-1' for key 'PRIMARY'");
    expect(uniqueViolationOf(raw)).toMatchObject({ driver: 'mysql', constraint: 'PRIMARY', table: undefined });
    const byErrnoOnly = Object.assign(new Error("Duplicate entry '7' for key 'uq_x'"), { errno: 1062 });
    expect(uniqueViolationOf(wrap(byErrnoOnly))).toMatchObject({ driver: 'mysql', constraint: 'uq_x' });
  });

  it('reads the columns SQLite names instead of the constraint', () => {
    const composite = new SqliteError(
      'UNIQUE constraint failed: orders.tenant_id, orders.order_no',
      'SQLITE_CONSTRAINT_UNIQUE',
    );
    expect(uniqueViolationOf(wrap(composite))).toEqual({
      driver: 'sqlite',
      table: 'orders',
      columns: ['tenant_id', 'order_no'],
      detail: 'UNIQUE constraint failed: orders.tenant_id, orders.order_no',
    });
    const primary = new SqliteError('UNIQUE constraint failed: orders.id', 'SQLITE_CONSTRAINT_PRIMARYKEY');
    expect(uniqueViolationOf(primary)).toMatchObject({ driver: 'sqlite', columns: ['id'] });
    const expression = new SqliteError("UNIQUE constraint failed: index 'uq_lower_email'", 'SQLITE_CONSTRAINT_UNIQUE');
    expect(uniqueViolationOf(expression)).toMatchObject({ driver: 'sqlite', constraint: 'uq_lower_email' });
  });

  it('ignores other constraint errors of both', () => {
    expect(uniqueViolationOf(wrap(new SqliteError('NOT NULL constraint failed: orders.no', 'SQLITE_CONSTRAINT_NOTNULL')))).toBeUndefined();
    expect(uniqueViolationOf(wrap(new SqliteError('FOREIGN KEY constraint failed', 'SQLITE_CONSTRAINT')))).toBeUndefined();
    const foreignKey = Object.assign(new Error('Cannot add or update a child row'), { code: 'ER_NO_REFERENCED_ROW_2', errno: 1452 });
    expect(uniqueViolationOf(wrap(foreignKey))).toBeUndefined();
  });
});
