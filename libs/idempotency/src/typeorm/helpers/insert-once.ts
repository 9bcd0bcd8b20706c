import { IsNull } from 'typeorm';
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
import { Logger } from '@nestjs/common';
import { AsyncLocalStorage } from 'node:async_hooks';
import { IdempotencyConfigError, IdempotencyError } from '../../index.js';
import { coverNewConnections } from '../postgres/new-connections.js';
import { namesNumbers } from './exact-numbers.js';
import { findOnPrimary } from './find-on-primary.js';
import { inCallersTransaction } from './routed-repositories.js';
import { stepsOf } from './sql-statements.js';
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
  given: Repository<T>,
  values: DeepPartial<T>,
  findExisting: (violation: UniqueViolation) => FindOptionsWhere<T> | FindOptionsWhere<T>[],
): Promise<InsertOnceResult<T>> {
  const repo = inCallersTransaction(given);
  coverNewConnections(repo.manager.connection);
  watchTransactions(repo.manager.connection);
  const entity = repo.create(values);
  const queryRunner = repo.manager.queryRunner;
  const inTransaction = queryRunner !== undefined && (queryRunner.isTransactionActive || beganWithRawSql(queryRunner));
  try {
    const insert = () => repo.insert(entity as QueryDeepPartialEntity<T>);
    // In its turn, so that the call keeps its place and its transaction (see underSavepoint).
    const checkedInsert = async () => {
      await refuseDeferredUnique(repo, queryRunner!);
      return insert();
    };
    const duplicate = (error: unknown) => uniqueViolationOf(error) !== undefined && isOwnInsert(repo, error);
    const result = inTransaction ? await underSavepoint(queryRunner!, stateOf(queryRunner!).generation, checkedInsert, duplicate) : await insert();
    // Database defaults (generated id, created_at, version) come back through RETURNING.
    const generated = result.generatedMaps[0];
    if (generated) repo.merge(entity, generated as DeepPartial<T>);
    return { created: true, entity };
  } catch (error) {
    const violation = uniqueViolationOf(error);
    if (!violation) throw error;
    if (!isOwnInsert(repo, error)) throw error;
    const where = findExisting(violation);
    // Named by a number a JSON parse rounded, the row found is another's (an adversarial helper:
    // the order ...037 was answered with ...000's row).
    if (!namesNumbers(where)) {
      throw new RangeError(
        `insertOnce: findExisting names the row by a number that names no one row (NaN, an infinity or an integer past 2^53, which a JSON parse rounds); send such ids as strings or bigints`,
        { cause: error },
      );
    }
    const existing = await existingRow(repo, where, violation);
    if (!existing) throw error;
    return { created: false, entity: existing, constraint: violation.constraint };
  }
}

/**
 * The row `where` names, which must be the one the violated key protects: a `null` in it is
 * `IS NULL` (the key's part, under NULLS NOT DISTINCT), and a `where` that matches more than one
 * row is refused. Both gave another row, silently (an adversarial helper): a partial unique
 * index's other rows (a cancelled one with the same ref), and a null part TypeORM's
 * `invalidWhereValuesBehavior: { null: 'ignore' }` dropped (another tenant's row).
 */
async function existingRow<T extends ObjectLiteral>(
  repo: Repository<T>,
  where: FindOptionsWhere<T> | FindOptionsWhere<T>[],
  violation: UniqueViolation,
): Promise<T | null> {
  const rows = await findOnPrimary(repo, nullsAsIsNull(where) as FindOptionsWhere<T> | FindOptionsWhere<T>[], 2);
  if (rows.length < 2) return rows[0] ?? null;
  throw new IdempotencyConfigError(
    `insertOnce: findExisting matched more than one row of ${repo.metadata.tablePath} (${violation.constraint ?? 'a unique key'} refused the insert): ` +
      "name only the rows that key protects, e.g. a partial unique index's condition (status: Not('CANCELLED'))",
  );
}

/**
 * `where` (or each of its alternatives) with each column given `null` made `IsNull()`. Only at the
 * top: a null inside a value (a jsonb column's) is that value's, and made `IS NULL` it found
 * nothing (an adversarial helper).
 */
function nullsAsIsNull(where: unknown): unknown {
  if (Array.isArray(where)) return where.map(nullsAsIsNull);
  if (typeof where !== 'object' || where === null) return where;
  return Object.fromEntries(Object.entries(where).map(([key, value]) => [key, value === null ? IsNull() : value]));
}

/** Per DataSource, per table: its unique constraints PostgreSQL checks only at COMMIT (`DEFERRABLE INITIALLY DEFERRED`). */
const deferredUniqueOf = new WeakMap<DataSource, Map<string, string[]>>();

/** $1 schema or NULL (the table as the INSERT finds it, on the `search_path`), $2 table. */
const DEFERRED_UNIQUE_SQL = `SELECT c.conname FROM pg_constraint AS c
 WHERE c.conrelid = to_regclass(CASE WHEN $1::text IS NULL THEN quote_ident($2) ELSE quote_ident($1) || '.' || quote_ident($2) END)
   AND c.contype IN ('u', 'p', 'x') AND c.condeferred`;

/**
 * Refuses a call in a transaction on a PostgreSQL table whose unique constraint is `DEFERRABLE
 * INITIALLY DEFERRED`: its INSERT of a duplicate goes through, `created: true` is answered, and
 * the violation comes at COMMIT, which then fails on every retry (an adversarial helper). Read on
 * the call's own connection until one read answered (calls of other transactions never wait on
 * it), then kept per table. Outside a transaction the INSERT's own commit checks the constraint,
 * and the duplicate is found as usual. A constraint deferred by `SET CONSTRAINTS` is not seen.
 */
async function refuseDeferredUnique(repo: Repository<ObjectLiteral>, queryRunner: QueryRunner): Promise<void> {
  const dataSource = repo.manager.connection;
  if (dataSource.options.type !== 'postgres') return;
  let tables = deferredUniqueOf.get(dataSource);
  if (!tables) deferredUniqueOf.set(dataSource, (tables = new Map()));
  const { schema, tableName, tablePath } = repo.metadata;
  let names = tables.get(tablePath);
  if (!names) {
    const rows = (await queryRunner.query(DEFERRED_UNIQUE_SQL, [schema ?? null, tableName])) as { conname: string }[];
    names = rows.map((row) => row.conname);
    tables.set(tablePath, names);
  }
  if (names.length === 0) return;
  throw new IdempotencyConfigError(
    `insertOnce: ${tablePath}'s unique constraint ${names.join(', ')} is DEFERRABLE INITIALLY DEFERRED, so in a transaction a ` +
      'duplicate is refused only at COMMIT, after insertOnce answered created. Make it NOT DEFERRABLE or INITIALLY IMMEDIATE, ' +
      'or call insertOnce outside a transaction',
  );
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
  /** The runner's transaction they are of (`RunnerState.generation`): a later one takes turns anew. */
  generation: number;
}
const turnsOf = new WeakMap<object, Turns>();
/** The section the current call runs inside, if any: its runner, and the transaction it was made in. */
interface Section {
  queryRunner: QueryRunner;
  generation: number;
}
const inSection = new AsyncLocalStorage<Section>();

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
function underSavepoint<R>(
  queryRunner: QueryRunner,
  generation: number,
  work: () => Promise<R>,
  duplicate: (error: unknown) => boolean,
  helper: 'insertOnce' | 'transition' = 'insertOnce',
): Promise<R> {
  const savepoint = helper === 'insertOnce';
  const enclosing = inSection.getStore();
  const scope = enclosing?.queryRunner === queryRunner ? enclosing : queryRunner;
  let turns = turnsOf.get(scope);
  if (!turns || turns.generation !== generation) turnsOf.set(scope, (turns = { failures: 0, generation }));
  const mineTurns = turns;
  const failuresBefore = mineTurns.failures;
  const turn = (): Promise<R> => {
    if (mineTurns.failures !== failuresBefore) {
      throw new IdempotencyError(`${helper}: a call beside this one on the same transaction failed, so this one did not run`);
    }
    if (queryRunner.isReleased || endedSince(queryRunner, generation) || !(queryRunner.isTransactionActive || beganWithRawSql(queryRunner))) {
      throw new IdempotencyError(`${helper}: the transaction ended before this call had its turn, so it did not run`);
    }
    // In its section: a helper called from inside it (a subscriber's) takes its turn among the
    // section's calls, and a statement of it asked once the transaction ended is refused.
    const section = { queryRunner, generation };
    return inSection.run(section, () => (savepoint ? savepointSection(queryRunner, generation, work) : work()));
  };
  const mine = (mineTurns.tail ?? Promise.resolve()).then(turn);
  // A duplicate is an answer (`created: false`), not a failure.
  mineTurns.tail = mine.then(
    () => undefined,
    (error: unknown) => void (duplicate(error) || mineTurns.failures++),
  );
  return mine;
}

/**
 * Runs `work`, another helper's statements on the repository's transaction (transition's UPDATE
 * and its reads), in its turn among the insertOnce calls on that transaction, without a savepoint
 * of its own. Beside such a call (`Promise.all` over one manager), its UPDATE went out inside
 * that call's savepoint, which a duplicate rolled back: transition answered `changed`, the
 * transaction committed, and the row had not moved (an adversarial helper, 20 of 20). Outside a
 * transaction, at once.
 */
export function inItsTurn<R>(repo: Repository<ObjectLiteral>, work: () => Promise<R>): Promise<R> {
  const queryRunner = repo.manager.queryRunner;
  if (queryRunner === undefined) return work();
  watchTransactions(repo.manager.connection);
  if (!(queryRunner.isTransactionActive || beganWithRawSql(queryRunner))) return work();
  return underSavepoint(queryRunner, stateOf(queryRunner).generation, work, () => false, 'transition');
}

/**
 * What insertOnce knows of a runner's transactions, from the statements asked of it (TypeORM's
 * `beforeQuery`, in the order `query()` sends them): `generation` counts the transactions begun
 * on it (a BEGIN or START TRANSACTION, TypeORM's own too), and `ending` says that the current one
 * is ending, and how (a ROLLBACK, ABORT or PREPARE TRANSACTION; a COMMIT or END; TypeORM's
 * rollback of the outermost transaction). A call belongs to the transaction it was made in: asked
 * after it ended, or in a later one, its statements are refused. Run then, a call's INSERT went
 * out after the app's raw ROLLBACK, outside any transaction, and committed (14 of 100
 * rolled-back transactions); a call left over from a rolled-back job ran in the runner's next
 * transaction, whose COMMIT then silently failed (4 of 150), or committed rows its own job had
 * rolled back (44 of 225: adversarial helpers, session 21).
 */
interface RunnerState {
  generation: number;
  ending?: 'commit' | 'rollback';
}
const runnerStates = new WeakMap<QueryRunner, RunnerState>();
function stateOf(queryRunner: QueryRunner): RunnerState {
  let state = runnerStates.get(queryRunner);
  if (!state) runnerStates.set(queryRunner, (state = { generation: 0 }));
  return state;
}

/** Whether the transaction a call was made in (`generation`) has ended, or is ending. */
function endedSince(queryRunner: QueryRunner, generation: number): boolean {
  const state = stateOf(queryRunner);
  return state.ending !== undefined || state.generation !== generation;
}

const watching = new WeakSet<DataSource>();
/** Per DataSource, how many subscribers it had when `sayIfAsyncBeforeQuery` last looked, and whether it said so. */
const subscribersSeen = new WeakMap<DataSource, { count: number; said: boolean }>();

/**
 * An `async beforeQuery` subscriber makes TypeORM wait for it between asking for a statement and
 * sending it, so a statement asked later (the app's ROLLBACK) can be sent first, and an INSERT
 * then commits on its own, or goes out on the connection after the runner was released, in
 * another job's transaction (a session-21 helper: 26 of 40). Order is what insertOnce reads a
 * transaction's end by; said once per DataSource, when such a subscriber is there.
 */
function sayIfAsyncBeforeQuery(dataSource: DataSource): void {
  const seen = subscribersSeen.get(dataSource);
  const count = dataSource.subscribers.length;
  if (seen && (seen.said || seen.count === count)) return;
  const async = dataSource.subscribers.find((subscriber) => subscriber.beforeQuery?.constructor.name === 'AsyncFunction');
  subscribersSeen.set(dataSource, { count, said: async !== undefined });
  if (async) {
    new Logger('Idempotency').warn(
      `insertOnce: ${async.constructor.name} has an async beforeQuery: TypeORM then sends a runner's statements out of the order ` +
        "they were asked for, and an INSERT racing the app's ROLLBACK may commit on its own. Make beforeQuery synchronous.",
    );
  }
}

/**
 * Adds, once per DataSource, a subscriber that keeps each runner's `RunnerState` from the
 * statements asked of it, and that refuses a statement of an insertOnce call (its section:
 * `inSection`) once the transaction the call was made in ended or is ending. Refused before it
 * is sent, nothing is undone afterwards: deleting a row that committed on its own (a first fix)
 * took it from a concurrent call already answered `created: false` with it (a second helper).
 */
function watchTransactions(dataSource: DataSource): void {
  sayIfAsyncBeforeQuery(dataSource);
  if (watching.has(dataSource)) return;
  watching.add(dataSource);
  const marker: EntitySubscriberInterface = {
    // TypeORM's rollback of the outermost transaction marks it before its ROLLBACK is asked; a
    // nested one's (`ROLLBACK TO SAVEPOINT`) ends nothing: marked, it refused every later call
    // of the outer transaction (a session-21 helper).
    beforeTransactionRollback: (event) => {
      const runner = event.queryRunner;
      const depth = (runner as { transactionDepth?: number } | undefined)?.transactionDepth ?? 0;
      if (runner && depth <= 1) stateOf(runner).ending = 'rollback';
    },
    beforeQuery: (event) => {
      const { queryRunner, query } = event;
      if (!queryRunner || typeof query !== 'string') return;
      const steps = stepsOf(query);
      if (steps.length > 0) {
        const state = stateOf(queryRunner);
        for (const step of steps) {
          if (step === 'start') {
            state.generation++;
            state.ending = undefined;
          } else if (state.ending !== 'rollback') {
            // A COMMIT after a ROLLBACK (TypeORM's own, once the app's callback rolled back with
            // manager.query('ROLLBACK') and returned) commits nothing: the rollback stands.
            state.ending = step === 'commit' || step === 'chain-commit' ? 'commit' : 'rollback';
          }
        }
        return;
      }
      const section = inSection.getStore();
      if (section?.queryRunner === queryRunner && endedSince(queryRunner, section.generation)) {
        throw new IdempotencyError(
          'insertOnce: the transaction this call was made in has ended or is ending (a ROLLBACK, COMMIT or BEGIN was asked ' +
            'of its runner first), so its statement was not sent',
        );
      }
    },
    // `... AND CHAIN` ends the transaction and begins the next at once: from its answer on, a
    // new call belongs to that next one.
    afterQuery: (event) => {
      const { queryRunner, query } = event;
      if (!queryRunner || typeof query !== 'string') return;
      const steps = stepsOf(query);
      if (steps.length > 0 && steps.at(-1)!.startsWith('chain-')) {
        const state = stateOf(queryRunner);
        state.generation++;
        state.ending = undefined;
      }
    },
  };
  dataSource.subscribers.push(marker);
}

async function savepointSection<R>(queryRunner: QueryRunner, generation: number, work: () => Promise<R>): Promise<R> {
  const sql = savepointSql(queryRunner.connection.driver.options.type, `idempotency_insert_once_${++savepoints}`);
  await queryRunner.query(sql.save);
  // The app asked for its ROLLBACK meanwhile (a promise beside this call in its Promise.all
  // failed): asked now, the INSERT would go out after it, outside any transaction, and commit.
  if (endedSince(queryRunner, generation)) throw new IdempotencyError('insertOnce: the transaction is rolling back, so this call did not insert');
  let result: R;
  try {
    result = await work();
  } catch (error) {
    // The transaction ended, or is ending: there is no savepoint to go back to.
    if (endedSince(queryRunner, generation) || !inTransactionNow(queryRunner)) throw error;
    await queryRunner.query(sql.rollback);
    if (sql.release) await queryRunner.query(sql.release);
    throw error;
  }
  if (endedSince(queryRunner, generation)) {
    // The INSERT went out inside the transaction; the app ended it after: its row is the
    // transaction's. A COMMIT keeps it (and releases the savepoint), a ROLLBACK undoes it.
    if (stateOf(queryRunner).ending === 'commit' && stateOf(queryRunner).generation === generation) return result;
    throw new IdempotencyError('insertOnce: the transaction was rolled back after this call inserted, so its row was not kept');
  }
  // The INSERT ran after the transaction ended all the same (a ROLLBACK sent past TypeORM, on the
  // driver's client): it committed on its own, and the row stays. Said, never answered `created`.
  if (!inTransactionNow(queryRunner)) {
    throw new IdempotencyError(
      "insertOnce: the transaction ended before this call's INSERT, which ran on its own and committed; its row stays",
    );
  }
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
