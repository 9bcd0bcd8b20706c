import type {
  DataSource,
  DeepPartial,
  EntitySubscriberInterface,
  FindOptionsWhere,
  ObjectLiteral,
  QueryDeepPartialEntity,
  QueryRunner,
  Repository,
} from 'typeorm';
import { AsyncLocalStorage } from 'node:async_hooks';
import { IdempotencyError } from '../../index.js';
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
  watchRollbacks(repo.manager.connection);
  const entity = repo.create(values);
  const queryRunner = repo.manager.queryRunner;
  const inTransaction = queryRunner !== undefined && (queryRunner.isTransactionActive || beganWithRawSql(queryRunner));
  try {
    const insert = () => repo.insert(entity as QueryDeepPartialEntity<T>);
    const duplicate = (error: unknown) => uniqueViolationOf(error) !== undefined && isOwnInsert(repo, error);
    const result = inTransaction ? await underSavepoint(queryRunner!, insert, duplicate).catch(undoOutside(repo)) : await insert();
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

/**
 * The calls of one scope take their turns: the calls on a transaction's QueryRunner, or the calls
 * made inside one call's section (an `afterInsert` subscriber's own insertOnce). `failures`
 * counts the turns that failed, so that the calls waiting then are refused, never run.
 */
interface Turns {
  tail?: Promise<unknown>;
  failures: number;
}
const turnsOf = new WeakMap<object, Turns>();
/** The section the current call runs inside, if any. */
const inSection = new AsyncLocalStorage<{ queryRunner: QueryRunner }>();

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
 * `created: true` were never written. A call made inside another's section (a subscriber's, run
 * by that INSERT) takes its turn among the calls of that section: waiting for the transaction's
 * turn, it waited for the call that was waiting on it, and the transaction hung. A call whose
 * turn comes after a call beside it failed (the app's transaction then rolls back), or after the
 * transaction ended, is refused and runs nothing: run then, its INSERT went in after the
 * ROLLBACK, outside any transaction, and committed (adversarial helpers, three rounds).
 */
function underSavepoint<R>(queryRunner: QueryRunner, work: () => Promise<R>, duplicate: (error: unknown) => boolean): Promise<R> {
  const enclosing = inSection.getStore();
  const scope = enclosing?.queryRunner === queryRunner ? enclosing : queryRunner;
  let turns = turnsOf.get(scope);
  if (!turns) turnsOf.set(scope, (turns = { failures: 0 }));
  const failuresBefore = turns.failures;
  const turn = (): Promise<R> => {
    if (turns.failures !== failuresBefore) {
      throw new IdempotencyError('insertOnce: a call beside this one on the same transaction failed, so this one did not run');
    }
    if (queryRunner.isReleased || rollingBack.has(queryRunner) || !(queryRunner.isTransactionActive || beganWithRawSql(queryRunner))) {
      throw new IdempotencyError('insertOnce: the transaction ended before this call had its turn, so it did not run');
    }
    return inSection.run({ queryRunner }, () => savepointSection(queryRunner, work));
  };
  const mine = (turns.tail ?? Promise.resolve()).then(turn);
  // A duplicate is an answer (`created: false`), not a failure.
  turns.tail = mine.then(
    () => undefined,
    (error: unknown) => void (duplicate(error) || turns.failures++),
  );
  return mine;
}

/** QueryRunners whose transaction TypeORM has begun to roll back (its `BeforeTransactionRollback`). */
const rollingBack = new WeakSet<QueryRunner>();
const watching = new WeakSet<DataSource>();

/** Adds, once per DataSource, a subscriber that marks each transaction TypeORM rolls back, until its QueryRunner starts another. */
function watchRollbacks(dataSource: DataSource): void {
  if (watching.has(dataSource)) return;
  watching.add(dataSource);
  const marker: EntitySubscriberInterface = {
    beforeTransactionRollback: (event) => void (event.queryRunner && rollingBack.add(event.queryRunner)),
    afterTransactionStart: (event) => void (event.queryRunner && rollingBack.delete(event.queryRunner)),
  };
  dataSource.subscribers.push(marker);
}

/**
 * The INSERT of a call ran after the transaction ended (`InsertedOutside`): it committed on its
 * own. The row is deleted again, by its primary key, and the call fails: its transaction did not
 * keep it, and neither does the table.
 */
function undoOutside<T extends ObjectLiteral>(repo: Repository<T>) {
  return async (error: unknown): Promise<never> => {
    if (!(error instanceof InsertedOutside)) throw error;
    const identifier = (error.result as { identifiers?: ObjectLiteral[] }).identifiers?.[0];
    let undone = false;
    if (identifier) undone = ((await repo.delete(identifier as FindOptionsWhere<T>)).affected ?? 0) > 0;
    throw new IdempotencyError(
      'insertOnce: the transaction ended (a ROLLBACK or COMMIT of the app went out) before this call\'s INSERT, which ran on ' +
        `its own and committed; ${undone ? 'the row was deleted again' : 'its row could not be deleted again'}, and this call did not insert`,
    );
  };
}

/** An INSERT that ran outside the transaction it was sent for, with what it answered. */
class InsertedOutside extends Error {
  constructor(readonly result: unknown) {
    super('insertOnce: the INSERT ran outside its transaction');
  }
}

async function savepointSection<R>(queryRunner: QueryRunner, work: () => Promise<R>): Promise<R> {
  const sql = savepointSql(queryRunner.connection.driver.options.type, `idempotency_insert_once_${++savepoints}`);
  await queryRunner.query(sql.save);
  // The app began its ROLLBACK meanwhile (a promise beside this call in its Promise.all
  // failed): sent now, the INSERT would go in after it, outside any transaction, and commit.
  if (rollingBack.has(queryRunner)) throw new IdempotencyError('insertOnce: the transaction is rolling back, so this call did not insert');
  let result: R;
  try {
    result = await work();
  } catch (error) {
    if (!inTransactionNow(queryRunner)) throw error; // the transaction ended: nothing to roll back to
    await queryRunner.query(sql.rollback);
    if (sql.release) await queryRunner.query(sql.release);
    throw error;
  }
  // A ROLLBACK (or COMMIT) the app sent between this call's SAVEPOINT and its INSERT went out
  // first, and the INSERT committed on its own: a transaction begun with a raw BEGIN has no
  // rollback event to mark it (an adversarial helper: 14 of 100 rolled-back transactions kept a row).
  if (!inTransactionNow(queryRunner)) throw new InsertedOutside(result);
  if (sql.release) await queryRunner.query(sql.release);
  return result;
}

/**
 * False when the server said, after the connection's last statement, that no transaction is
 * open (node-postgres keeps that status); true where the driver does not tell.
 */
function inTransactionNow(queryRunner: QueryRunner): boolean {
  const status = transactionStatusOf(queryRunner);
  return status === undefined || status !== 'I';
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
  return transactionStatusOf(queryRunner) === 'T';
}

/** node-postgres's transaction status of the connection (`I` idle, `T` in a transaction, `E` failed one), if the driver is it. */
function transactionStatusOf(queryRunner: QueryRunner): string | undefined {
  const client = (queryRunner as unknown as { databaseConnection?: { getTransactionStatus?: () => string | null } })
    .databaseConnection;
  return typeof client?.getTransactionStatus === 'function' ? (client.getTransactionStatus() ?? undefined) : undefined;
}
