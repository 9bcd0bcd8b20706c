import type {
  DeepPartial,
  FindOptionsWhere,
  ObjectLiteral,
  QueryDeepPartialEntity,
  QueryRunner,
  Repository,
} from 'typeorm';
import { AsyncLocalStorage } from 'node:async_hooks';
import { coverNewConnections } from '../postgres/new-connections.js';
import { findOnPrimary } from './find-on-primary.js';
import { uniqueViolationOf, type UniqueViolation } from './unique-violation.js';

/** What `insertOnce` did: inserted the row, or found the one a unique constraint protects. */
export type InsertOnceResult<T> =
  | { created: true; entity: T }
  | { created: false; entity: T; constraint?: string };

/**
 * Inserts `values` with one plain INSERT and lets the database's unique constraints decide between
 * concurrent callers (never find-then-insert, which lets two callers both pass the find). When a
 * unique constraint refuses the row, loads the row it protects with `findExisting(violation)`
 * and returns it with `created: false`.
 *
 * Inside a transaction (the repository of a transactional `EntityManager`, or of a QueryRunner's
 * manager after a raw `BEGIN` on PostgreSQL), the INSERT runs under a savepoint, so a refused row
 * does not abort the transaction on PostgreSQL: the transaction carries on and may commit its
 * other work. The savepoint fires no transaction event (`afterTransactionCommit` and the like):
 * those stay the caller's transaction's own.
 *
 * A unique violation of another statement (an `afterInsert` subscriber's write to another
 * table, after the INSERT went through) is rethrown, not taken for a duplicate: TypeORM names the
 * failing statement, and only one that inserts into the entity's table is this call's. (A
 * subscriber's INSERT into the same table cannot be told apart.)
 *
 * The existing row is read on the primary when the DataSource has read replicas (a replica may
 * not have it yet).
 *
 * Rethrows the original error when it is not a unique violation, and when no row matches
 * `findExisting` after one (the other row was deleted meanwhile, or, under REPEATABLE READ or
 * SERIALIZABLE, it was committed after this transaction's snapshot and is invisible to it).
 *
 * @param findExisting where to find the existing row, e.g. `(v) => ({ orderNo })`; the violation
 *   says which constraint refused the row, for tables with more than one unique key.
 */
export async function insertOnce<T extends ObjectLiteral>(
  repo: Repository<T>,
  values: DeepPartial<T>,
  findExisting: (violation: UniqueViolation) => FindOptionsWhere<T> | FindOptionsWhere<T>[],
): Promise<InsertOnceResult<T>> {
  coverNewConnections(repo.manager.connection);
  const entity = repo.create(values);
  const queryRunner = repo.manager.queryRunner;
  const inTransaction = queryRunner !== undefined && (queryRunner.isTransactionActive || beganWithRawSql(queryRunner));
  try {
    const insert = () => repo.insert(entity as QueryDeepPartialEntity<T>);
    const result = inTransaction ? await underSavepoint(queryRunner!, insert) : await insert();
    // Database defaults (generated id, created_at, version) come back through RETURNING.
    const generated = result.generatedMaps[0];
    if (generated) repo.merge(entity, generated as DeepPartial<T>);
    return { created: true, entity };
  } catch (error) {
    const violation = uniqueViolationOf(error);
    if (!violation) throw error;
    if (!isOwnInsert(repo, error)) throw error;
    const existing = await findOnPrimary(repo, findExisting(violation));
    if (!existing) throw error;
    return { created: false, entity: existing, constraint: violation.constraint };
  }
}

/**
 * Whether a unique violation is this call's INSERT's, as TypeORM's `QueryFailedError` names the
 * statement (comments left out). Only a statement that plainly is another is another's: an
 * UPDATE, a DELETE, a SELECT or a CALL (a function or a procedure that writes), or an INSERT into
 * another table than the entity's (compared without quotes, by the path TypeORM writes: a view
 * or a partitioned table's parent, whatever PostgreSQL then names). A statement it cannot read
 * (a raw driver error, a CTE) is taken for this call's, as before.
 */
function isOwnInsert(repo: Repository<ObjectLiteral>, error: unknown): boolean {
  const query = (error as { query?: unknown }).query;
  if (typeof query !== 'string') return true;
  const statement = query.replace(COMMENTS, ' ').trim();
  if (OTHER_STATEMENT.test(statement)) return false;
  const insert = INSERT_INTO.exec(statement);
  return !insert || unquoted(insert[1]) === unquoted(repo.metadata.tablePath);
}

/** SQL comments: `/* ... *\/` and `-- ...` to the end of the line. */
const COMMENTS = /\/\*[\s\S]*?\*\/|--[^\n]*/g;
const OTHER_STATEMENT = /^(?:update|delete|select|call)\b/i;
/** An INSERT's target: identifiers, quoted (spaces allowed) or not, joined by dots. */
const INSERT_INTO = /^insert\s+into\s+((?:"[^"]*"|`[^`]*`|\[[^\]]*\]|[^\s(."`[]+)(?:\.(?:"[^"]*"|`[^`]*`|\[[^\]]*\]|[^\s(."`[]+))*)/i;

const unquoted = (path: string) => path.replace(/["`[\]]/g, '');

/** Savepoint names, unique in the process: insertOnce calls on one connection never share one. */
let savepoints = 0;

/** The savepoint section running on each transaction's QueryRunner, for the next call to wait on. */
const sections = new WeakMap<QueryRunner, Promise<unknown>>();
/** The QueryRunner whose section the current call runs in. */
const inSection = new AsyncLocalStorage<QueryRunner>();

/**
 * Runs `work` under a savepoint of its own in the active transaction, with plain SAVEPOINT
 * statements on the same QueryRunner. Not TypeORM's nested `startTransaction`: that broadcasts
 * the transaction events of a real start / commit / rollback, so a subscriber that publishes in
 * `afterTransactionCommit` published a row whose transaction later rolled back, and one that
 * drops its queue in `afterTransactionRollback` lost the rows inserted before a duplicate.
 *
 * Calls on one transaction (`Promise.all` over one manager) take their turns: interleaved, one
 * call's `RELEASE` released the savepoint another had made after it, whose own `RELEASE` then
 * failed and aborted the transaction; its COMMIT became a rollback, and rows already answered
 * `created: true` were never written.
 */
function underSavepoint<R>(queryRunner: QueryRunner, work: () => Promise<R>): Promise<R> {
  // A call made inside another's section (an `afterInsert` subscriber's own insertOnce, run by
  // that INSERT) nests its savepoint in the other's: waiting for its turn, it waited for the very
  // call that was waiting on it, and the transaction hung (an adversarial helper).
  if (inSection.getStore() === queryRunner) return savepointSection(queryRunner, work);
  const section = () => inSection.run(queryRunner, () => savepointSection(queryRunner, work));
  const before = sections.get(queryRunner);
  const mine = before ? before.then(section, section) : section();
  sections.set(queryRunner, mine.catch(() => undefined));
  return mine;
}

async function savepointSection<R>(queryRunner: QueryRunner, work: () => Promise<R>): Promise<R> {
  const sql = savepointSql(queryRunner.connection.driver.options.type, `idempotency_insert_once_${++savepoints}`);
  await queryRunner.query(sql.save);
  let result: R;
  try {
    result = await work();
  } catch (error) {
    await queryRunner.query(sql.rollback);
    if (sql.release) await queryRunner.query(sql.release);
    throw error;
  }
  if (sql.release) await queryRunner.query(sql.release);
  return result;
}

/** The savepoint statements of a driver, as TypeORM's own query runners write them. */
function savepointSql(type: string, name: string): { save: string; rollback: string; release?: string } {
  if (type === 'mssql') return { save: `SAVE TRANSACTION ${name}`, rollback: `ROLLBACK TRANSACTION ${name}` };
  const standard = { save: `SAVEPOINT ${name}`, rollback: `ROLLBACK TO SAVEPOINT ${name}` };
  return type === 'oracle' ? standard : { ...standard, release: `RELEASE SAVEPOINT ${name}` };
}

/**
 * A transaction TypeORM does not know of (`queryRunner.query('BEGIN')`), on PostgreSQL, where a
 * refused INSERT would abort it: node-postgres keeps the server's transaction status from its
 * last answer, so no round trip. Other drivers undo only the refused statement and need no savepoint.
 */
function beganWithRawSql(queryRunner: QueryRunner): boolean {
  const client = (queryRunner as unknown as { databaseConnection?: { getTransactionStatus?: () => string | null } })
    .databaseConnection;
  return typeof client?.getTransactionStatus === 'function' && client.getTransactionStatus() === 'T';
}
