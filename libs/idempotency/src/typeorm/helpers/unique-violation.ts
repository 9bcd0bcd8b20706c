/** A unique (or primary key) constraint refused a write, as the database reported it. */
export interface UniqueViolation {
  driver: 'postgres' | 'mysql' | 'sqlite';
  /**
   * The constraint or index name: PostgreSQL's `constraint`, MySQL's key name (without the
   * `table.` prefix MySQL 8 adds), SQLite's index name when it reports one (expression indexes).
   */
  constraint?: string;
  /** The database's own explanation (PostgreSQL `detail`, otherwise the driver's message). */
  detail?: string;
  /** The table, when the driver names it. */
  table?: string;
  /** The columns of the constraint, when the driver names them instead of the constraint (SQLite). */
  columns?: string[];
}

interface DriverErrorShape {
  code?: unknown;
  errno?: unknown;
  message?: unknown;
  sqlMessage?: unknown;
  constraint?: unknown;
  detail?: unknown;
  table?: unknown;
  driverError?: unknown;
}

const MYSQL_DUP_ERRNOS = new Set([1062, 1586]);
const SQLITE_UNIQUE_CODES = new Set(['SQLITE_CONSTRAINT_UNIQUE', 'SQLITE_CONSTRAINT_PRIMARYKEY']);

/**
 * Tells whether `error` is a unique-constraint violation and which constraint refused the write.
 * Accepts TypeORM's `QueryFailedError` (it reads `driverError`) and the raw driver errors of
 * pg (`code` 23505), mysql/mysql2/MariaDB (`ER_DUP_ENTRY`, errno 1062) and better-sqlite3
 * (`SQLITE_CONSTRAINT_UNIQUE` / `SQLITE_CONSTRAINT_PRIMARYKEY`). Anything else: `undefined`.
 */
export function uniqueViolationOf(error: unknown): UniqueViolation | undefined {
  if (!isObject(error)) return undefined;
  // QueryFailedError copies the driver error's fields onto itself, but driverError is the source.
  const raw = isObject(error.driverError) ? error.driverError : error;
  return postgresViolation(raw) ?? mysqlViolation(raw) ?? sqliteViolation(raw);
}

function postgresViolation(error: DriverErrorShape): UniqueViolation | undefined {
  if (error.code !== '23505') return undefined;
  return {
    driver: 'postgres',
    constraint: stringOrUndefined(error.constraint),
    detail: stringOrUndefined(error.detail) ?? stringOrUndefined(error.message),
    table: stringOrUndefined(error.table),
  };
}

function mysqlViolation(error: DriverErrorShape): UniqueViolation | undefined {
  if (error.code !== 'ER_DUP_ENTRY' && !MYSQL_DUP_ERRNOS.has(error.errno as number)) return undefined;
  const message = stringOrUndefined(error.sqlMessage) ?? stringOrUndefined(error.message) ?? '';
  // "Duplicate entry 'A-1' for key 'orders.uq_orders_order_no'" (MySQL 8) or "... for key 'uq_...'".
  // The entry may itself contain quotes, so the key is taken from the end of the message.
  const key = /for key '(.*)'\s*$/.exec(message)?.[1];
  const dot = key?.indexOf('.') ?? -1;
  return {
    driver: 'mysql',
    constraint: key === undefined ? undefined : key.slice(dot + 1),
    table: key !== undefined && dot > 0 ? key.slice(0, dot) : undefined,
    detail: message || undefined,
  };
}

function sqliteViolation(error: DriverErrorShape): UniqueViolation | undefined {
  const message = stringOrUndefined(error.message) ?? '';
  const unique = /UNIQUE constraint failed: (.+?)\s*$/.exec(message);
  const coded = SQLITE_UNIQUE_CODES.has(error.code as string);
  // Drivers that only report the primary code (SQLITE_CONSTRAINT) still say "UNIQUE" in the text.
  if (!coded && !(error.code === 'SQLITE_CONSTRAINT' && unique)) return undefined;
  const violation: UniqueViolation = { driver: 'sqlite', detail: message || undefined };
  if (!unique) return violation;
  const index = /^index '(.+)'$/.exec(unique[1]);
  if (index) return { ...violation, constraint: index[1] };
  // "UNIQUE constraint failed: orders.tenant_id, orders.order_no"
  const qualified = unique[1].split(',').map((column) => column.trim());
  const dot = qualified[0].lastIndexOf('.');
  return {
    ...violation,
    table: dot > 0 ? qualified[0].slice(0, dot) : undefined,
    columns: qualified.map((column) => column.slice(column.lastIndexOf('.') + 1)),
  };
}

function isObject(value: unknown): value is DriverErrorShape {
  return typeof value === 'object' && value !== null;
}

function stringOrUndefined(value: unknown): string | undefined {
  return typeof value === 'string' && value !== '' ? value : undefined;
}
