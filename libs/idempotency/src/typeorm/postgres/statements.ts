// What PostgresIdempotencyStore (store/) and PostgresOutcomeRecorder (outcomes/) share, written
// once in this folder, so that both run, time, fence and purge their statements the same way:
// - statements.ts: running one statement (on a pooled connection or a transaction's runner;
//   database errors as IdempotencyStoreError) and running a claim again when its snapshot
//   missed a concurrent commit;
// - lease-sql.ts: database-clock time (where a lease or a retention ends, the milliseconds left)
//   and the owner-token fence of a write;
// - purge.ts: the batched purge of expired rows and its timer;
// - table-name.ts: quoting and schema-qualifying a table name (the migrations use it too).
// What stays apart is what each table means. The store claims ONE key for the guard and holds
// `processing` | `completed`, its internal record of a request. The recorder claims by a request
// id AND a content hash, with take-over rules (FAILED may run again, a corrected retry keeps its
// request id), and holds the public `OutcomeState`, `PROCESSING` | `SUCCESS` | `FAILED`. Both
// vocabularies are what the tables hold on disk, so the claims and the states stay two. The
// fences differ in one point, on purpose: the recorder's `succeed`/`fail` still accept an owner
// whose lease ran out while nobody took the record over (`succeedWith` relies on it); every
// other fenced write, and both renewals, also need the lease to be running.
import type { DataSource, QueryResult, QueryRunner } from 'typeorm';
import { IdempotencyConfigError, IdempotencyStoreError } from '../../index.js';

/** Runs one statement: `sql` with `params`, on `runner` when given (a transaction's). */
export type RunStatement = (sql: string, params: unknown[], runner?: QueryRunner) => Promise<QueryResult>;

/** How many times a claim statement runs when its snapshot keeps missing a concurrent commit. */
const CLAIM_ATTEMPTS = 5;

/**
 * Runs statements of `dataSource`: on the runner given (a transaction's), else on a connection
 * taken from the pool and released after the statement. The result holds the rows and the
 * affected count. Database errors become `IdempotencyStoreError` with the driver's error as `cause`.
 */
export function statementRunner(dataSource: DataSource): RunStatement {
  return async (sql, params, runner) => {
    let pooled: QueryRunner | undefined;
    try {
      return await (runner ?? (pooled = dataSource.createQueryRunner())).query(sql, params, true);
    } catch (error) {
      throw new IdempotencyStoreError(`PostgreSQL query failed: ${(error as Error).message}`, { cause: error });
    } finally {
      await pooled?.release();
    }
  };
}

/**
 * Runs `attempt` (one claim statement, and the answer read from its rows) until it answers, at
 * most `CLAIM_ATTEMPTS` times. In READ COMMITTED a claim finds the row that refused it by the
 * latest committed version, but reads it from the snapshot taken when its statement began, so a
 * row a concurrent claim committed meanwhile can be missing: `attempt` answers `undefined`, and
 * the next statement takes a fresh snapshot. `what` names the claim in the error thrown when no
 * attempt answers.
 */
export async function claimUntilAnswered<T>(what: string, attempt: () => Promise<T | undefined>): Promise<T> {
  for (let i = 1; i <= CLAIM_ATTEMPTS; i++) {
    const answer = await attempt();
    if (answer !== undefined) return answer;
  }
  throw new IdempotencyStoreError(`PostgreSQL ${what} found no answer in ${CLAIM_ATTEMPTS} attempts`);
}

/** The SQLSTATE of a database error (TypeORM's `QueryFailedError` or pg's own), e.g. `40P01`. */
export function sqlStateOf(error: unknown): unknown {
  const shape = error as { code?: unknown; driverError?: { code?: unknown } } | undefined;
  return shape?.driverError?.code ?? shape?.code;
}

/** `value`, a positive number of milliseconds, or an `IdempotencyConfigError` naming `owner` and `name`. */
export function positiveMs(owner: string, name: string, value: number): number {
  if (!Number.isFinite(value) || value <= 0) {
    throw new IdempotencyConfigError(`${owner}: ${name} must be a positive number of milliseconds, got ${value}`);
  }
  return value;
}

/**
 * The schema of a PostgreSQL DataSource (undefined: the search path decides); any other
 * DataSource is refused, naming `owner` (the class that needs it).
 */
export function postgresSchemaOf(owner: string, dataSource: DataSource): string | undefined {
  const { options } = dataSource;
  if (options.type !== 'postgres') throw new IdempotencyConfigError(`${owner} needs a postgres DataSource, not ${options.type}`);
  return options.schema;
}
