// What PostgresIdempotencyStore (store/) and PostgresOutcomeRecorder (outcomes/) share, written
// once in this folder, so that both run, time, fence and purge their statements the same way:
// - statements.ts: running one statement (a named prepared statement on a pooled connection or
//   on a transaction's runner; database errors as IdempotencyStoreError) and running a claim
//   again when its snapshot missed a concurrent commit;
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
import { Logger } from '@nestjs/common';
import { createHash } from 'node:crypto';
import { QueryFailedError, QueryRunnerAlreadyReleasedError, TypeORMError, type DataSource, type QueryRunner } from 'typeorm';
import { IdempotencyConfigError, IdempotencyStoreError } from '../../index.js';
import { coverNewConnections } from './new-connections.js';
import { PoolProgress, type PgPoolEvents } from './pool-progress.js';

/** The rows a statement returned and the rows it affected (written ones for INSERT/UPDATE/DELETE). */
export interface StatementResult {
  records: unknown[];
  affected?: number;
}

/** The bound of a statement runner's pooled statements (`statementRunner`). */
export interface StatementBound {
  /** How long a free connection, and then a statement's answer, may take, in milliseconds. */
  timeoutMs?: number;
  /** Told the server process id and the text of a statement given up on after it went out. */
  abandoned?: (pid: number, sql: string) => void;
  /**
   * Whether this runner's statements show its pool moving to calls that wait for a connection
   * (see `onPooled`). Default true; false for statements that answer in an outage too (ending
   * the server processes of abandoned statements), which would keep waiters waiting through one.
   */
  showsProgress?: boolean;
  /**
   * Whether this runner's statements wait for a connection ahead of the pool's other waiters,
   * taking turns with them once urgent ones wait already: see `jumpQueue`. Default false.
   */
  urgent?: boolean;
}

/**
 * Runs one statement: `sql` with `params`, on `runner` when given (a transaction's). `params` may
 * be a function, called once when the statement goes out (the pool has handed it a connection),
 * for a statement that carries what is due then (`PostgresIdempotencyStore.renew`).
 */
export type RunStatement = (sql: string, params: unknown[] | (() => unknown[]), runner?: QueryRunner) => Promise<StatementResult>;

/** The part of a pg `Client` (and of pg-pool's pooled client) a statement needs. */
interface PgClient {
  query(config: { name?: string; text: string; values: unknown[] }): Promise<{ rows: unknown[]; rowCount: number | null }>;
  on(event: 'error', listener: (error: Error) => void): unknown;
  removeListener(event: 'error', listener: (error: Error) => void): unknown;
}
interface PooledPgClient extends PgClient {
  release(error?: Error): void;
  /** pg's protocol connection, and its socket (what came back on it). */
  connection?: { stream?: { bytesRead?: number } };
}

/** pg-pool of TypeORM's PostgresDriver: `master` (the only pool, or the primary's with replication). */
interface PostgresDriverPools {
  master?: PgPoolEvents & { connect(callback: (error: Error | undefined, client: PooledPgClient | undefined) => void): void };
}

/** `cached plan must not change result type`: the table changed under a prepared statement. */
const PLAN_CHANGED = '0A000';
/** `prepared statement ... does not exist`: the session lost it (DISCARD ALL, DEALLOCATE, a transaction-mode pooler). */
const NO_SUCH_STATEMENT = '26000';
/**
 * `prepared statement ... already exists`: the session holds one of that name that this client
 * never prepared, so another client shares it (a pooler in transaction mode hands one server
 * session to many clients). Only this told a new client so, once others had prepared the
 * statement on every session: it never met a 26000, the claim failed as a store outage, and
 * routes ran unguarded, one key up to 93 times in a burst (an adversarial helper, PgBouncer).
 */
const STATEMENT_EXISTS = '42P05';

/**
 * `could not serialize access` (40001) and `deadlock detected` (40P01): PostgreSQL rolled the
 * statement's transaction back, and says to run it again. A statement of the store's own, alone
 * in its transaction, meets them where the pool's sessions default to REPEATABLE READ or
 * SERIALIZABLE (`default_transaction_isolation` set for the role, the database or the
 * connection): concurrent claims of one key failed with 40001 on a healthy database, as an
 * outage, and a fail-open route ran one key up to 6 times (an adversarial helper).
 */
const TRY_AGAIN = new Set(['40001', '40P01']);
/** How many times a statement outside a transaction runs while PostgreSQL answers `TRY_AGAIN`. */
const TRY_AGAIN_ATTEMPTS = 10;

/** Statement names by SQL text: a digest of the text, so that one text has one name in every session. */
const names = new Map<string, string>();
/** Per connection, the texts whose prepared statement PostgreSQL refused, and how many times: they run under a new name. */
const renamed = new WeakMap<object, Map<string, number>>();

function statementName(client: object, sql: string): string {
  let name = names.get(sql);
  if (name === undefined) {
    name = `idempotency_${createHash('sha256').update(sql).digest('hex').slice(0, 24)}`;
    names.set(sql, name);
  }
  const generation = renamed.get(client)?.get(sql);
  return generation === undefined ? name : `${name}_${generation}`;
}

function rename(client: object, sql: string): void {
  let texts = renamed.get(client);
  if (!texts) renamed.set(client, (texts = new Map()));
  texts.set(sql, (texts.get(sql) ?? 0) + 1);
}

/**
 * Runs statements of `dataSource`: on the runner given (a transaction's: on its connection),
 * else on a connection taken from the DataSource's pool (the primary's, with replication) and
 * released after the statement. Each SQL text is a named prepared statement, parsed and planned
 * once per connection, not on every call; TypeORM's logger still sees every statement. The
 * result holds the rows and the affected count. Database errors become `IdempotencyStoreError`
 * with TypeORM's `QueryFailedError` (holding the driver's error) as `cause`.
 *
 * A prepared statement whose table changed its result type (a migration) is prepared again under
 * a new name on that connection; when a session loses a prepared statement (DISCARD ALL, a pooler
 * in transaction mode), or holds one of that name another client made (a pooler in transaction
 * mode), this runner stops preparing and runs every statement unnamed. Either way
 * the refused statement did nothing and runs again at once, outside a transaction; inside one,
 * the error has aborted the transaction and is thrown, and the next transaction runs it anew.
 *
 * `timeoutMs` bounds each statement on a pooled connection (see `onPooled`); a transaction's
 * statements are the transaction owner's to bound. `abandoned` is told the server process of a
 * statement given up on after it went out: it may still be running there.
 */
export function statementRunner(dataSource: DataSource, { timeoutMs, abandoned, showsProgress = true, urgent = false }: StatementBound = {}): RunStatement {
  const { logger } = dataSource;
  let prepare = true;
  const prepared = async (client: PgClient, sql: string, values: unknown[], canRetry: boolean) => {
    if (!prepare) return client.query({ text: sql, values });
    try {
      return await client.query({ name: statementName(client, sql), text: sql, values });
    } catch (error) {
      const state = sqlStateOf(error);
      if (state === PLAN_CHANGED) rename(client, sql);
      else if (state === NO_SUCH_STATEMENT || state === STATEMENT_EXISTS) lostStatements(state);
      else throw error;
      if (!canRetry) throw error;
      return client.query({ name: prepare ? statementName(client, sql) : undefined, text: sql, values });
    }
  };
  const lostStatements = (state: string) => {
    if (!prepare) return;
    prepare = false;
    const what =
      state === STATEMENT_EXISTS
        ? 'A PostgreSQL session holds a prepared statement another client made (a pooler in transaction mode, such as PgBouncer?)'
        : 'A PostgreSQL session lost a prepared statement (DISCARD ALL, or a pooler in transaction mode?)';
    Logger.warn(`${what}: statements now run unnamed`, 'IdempotencyStatements');
  };
  // As TypeORM's QueryRunner does: log, time, and wrap a failed query in QueryFailedError.
  const query = async (client: PgClient, sql: string, given: unknown[] | (() => unknown[]), runner?: QueryRunner) => {
    const params = typeof given === 'function' ? given() : given;
    // Outside a transaction a refused statement runs again; inside one, the error aborted it.
    const canRetry = !runner?.isTransactionActive;
    logger.logQuery(sql, params, runner);
    const started = Date.now();
    try {
      const raw = canRetry ? await tryingAgain(() => prepared(client, sql, params, true)) : await prepared(client, sql, params, false);
      const slowMs = dataSource.options.maxQueryExecutionTime;
      if (slowMs && Date.now() - started > slowMs) logger.logQuerySlow(Date.now() - started, sql, params, runner);
      return { records: raw.rows, affected: raw.rowCount ?? undefined };
    } catch (error) {
      logger.logQueryError(error as Error, sql, params, runner);
      throw new QueryFailedError(sql, params, error as Error);
    }
  };
  return async (sql, params, runner) => {
    coverNewConnections(dataSource);
    try {
      if (runner) return await onRunner(runner, (client) => query(client, sql, params, runner));
      const bound = timeoutMs === undefined ? undefined : { timeoutMs, showsProgress, abandoned: abandoned && ((pid: number) => abandoned(pid, sql)) };
      return await onPooled(dataSource, (client) => query(client, sql, params), bound, urgent);
    } catch (error) {
      throw new IdempotencyStoreError(`PostgreSQL query failed: ${(error as Error).message}`, { cause: error });
    }
  };
}

/** Whether PostgreSQL refused a statement with `TRY_AGAIN` (40001, 40P01): its transaction rolled back, to run again. */
export function mustRunAgain(error: unknown): boolean {
  return TRY_AGAIN.has(sqlStateOf(error) as string);
}

/**
 * Runs `statement` (alone in its transaction, or a transaction that did nothing else yet) again
 * while it fails as `mayRunAgain` says (by default PostgreSQL's `TRY_AGAIN`), at most
 * `TRY_AGAIN_ATTEMPTS` times.
 */
export async function tryingAgain<T>(statement: () => Promise<T>, mayRunAgain: (error: unknown) => boolean = mustRunAgain): Promise<T> {
  for (let attempt = 1; ; attempt++) {
    try {
      return await statement();
    } catch (error) {
      if (!mayRunAgain(error) || attempt >= TRY_AGAIN_ATTEMPTS) throw error;
      // Statements racing on one row in lockstep can keep failing each other: a short random pause.
      await new Promise((resolve) => setTimeout(resolve, Math.random() * attempt));
    }
  }
}

/** Runs `work` on the connection of `runner` (TypeORM's, with its own error listener). */
async function onRunner<T>(runner: QueryRunner, work: (client: PgClient) => Promise<T>): Promise<T> {
  if (runner.isReleased) throw new QueryRunnerAlreadyReleasedError();
  return work((await runner.connect()) as PgClient);
}

/**
 * Runs `work` on a connection of the DataSource's pool and gives it back. A connection that
 * fails meanwhile leaves the pool, and its 'error' event has a listener from the moment the pool
 * hands it over (none would crash the process). The listener is added in the pool's callback,
 * not after an awaited `connect()`: a new connection's "ready" and the server's "terminating" (a
 * failover) can arrive in one socket read, and the error then fires before an await resumes.
 *
 * With `timeoutMs`, a free connection, then the statement's answer, are each bounded by it (the
 * second timer starts when the pool hands the connection over: after a stall of the process in
 * which the pool was to hand it over, the statement only then goes out). A wait for a connection
 * goes on past its bound while the pool moves: as long as each `timeoutMs` brings bytes to one of
 * the pool's connections handed out, whoever holds it (`PoolProgress`: a busy database works
 * through its queue, the app's own queries' too, and pg-pool hands connections over in order; a
 * hung or locked one sends nothing). pg-pool's own `connectionTimeoutMillis` bounds that wait,
 * as it bounds every wait for its connections. Past a bound the call fails, the connection it
 * waited on leaves the pool (its statement may still be running on the server, so it is not
 * reused, and `abandoned` is told its server process), and a connection handed over later goes
 * back at once. As with the Redis store's bound, a failure waits one turn
 * of the event loop past its timer, so that an answer read after a stall of the process wins; and
 * while the answer comes in on the connection (a large one does not fit in the socket's receive
 * buffer: after a stall the first read takes a part) it waits on, as long as each `PROGRESS_MS`
 * brings bytes (the connection carries this statement only, so they are its answer).
 */
async function onPooled<T>(
  dataSource: DataSource,
  work: (client: PgClient) => Promise<T>,
  bound?: { timeoutMs: number; showsProgress: boolean; abandoned?: (pid: number) => void },
  urgent = false,
): Promise<T> {
  const pool = (dataSource.driver as unknown as PostgresDriverPools).master;
  if (!pool) throw new TypeORMError('Driver not Connected');
  const progress = PoolProgress.of(pool);
  let expired = false;
  /** Releases the connection handed over, with an error: it leaves the pool. */
  let drop: ((error: Error) => void) | undefined;
  /** The server process of the connection handed over. */
  let pid: number | undefined;
  /** What the connection handed over has read: its answer coming in. */
  let bytesRead: (() => number | undefined) | undefined;
  /** Re-arms the bound when the connection is handed over (with a bound). */
  let handedOver: (() => void) | undefined;
  const run = (async () => {
    const { client, release } = await new Promise<{ client: PooledPgClient; release: (error?: Error) => void }>((resolve, reject) => {
      const queued = urgent ? queueOf(pool) : undefined;
      const before = queued?.length;
      pool.connect((error, connected) => {
        if (error || !connected) return reject(error ?? new TypeORMError('The pool gave no connection'));
        let released = false;
        const release = (failure?: Error) => {
          if (released) return;
          released = true;
          connected.release(failure);
        };
        connected.on('error', release);
        if (expired) {
          connected.removeListener('error', release);
          release();
          return reject(new TypeORMError('The pool gave a connection after the bound'));
        }
        drop = release;
        pid = (connected as { processID?: number }).processID;
        bytesRead = () => connected.connection?.stream?.bytesRead;
        handedOver?.();
        resolve({ client: connected, release });
      });
      if (queued && queued.length > before!) jumpQueue(queued);
    });
    const given = bound && !bound.showsProgress ? progress.quietly(client) : undefined;
    /** A failure that is not the statement's own (a lost connection, pg's `query_timeout`): the connection leaves the pool. */
    let broken: Error | undefined;
    try {
      return await work(client);
    } catch (error) {
      if (!isStatementError(error)) broken = error as Error;
      throw error;
    } finally {
      client.removeListener('error', release);
      release(broken);
      given?.();
    }
  })();
  if (bound === undefined) return run;
  const { timeoutMs, abandoned } = bound;
  return new Promise<T>((resolve, reject) => {
    let settled = false;
    let read: number | undefined;
    /** What had come back on the pool when the wait for a connection last looked. */
    let moved = progress.mark();
    /** Bumped when the handover re-arms the bound: a check the earlier bound queued then stands down. */
    let generation = 0;
    const expire = () => {
      const expiring = generation;
      setImmediate(() => {
        if (settled || expiring !== generation) return;
        if (drop === undefined && progress.mark() !== moved) {
          moved = progress.mark();
          timer = setTimeout(expire, timeoutMs);
          return;
        }
        const now = bytesRead?.();
        if (now !== undefined && now !== read) {
          read = now;
          timer = setTimeout(expire, PROGRESS_MS);
          return;
        }
        expired = true;
        const error = new NoAnswerInTime(`no answer within ${timeoutMs} ms`);
        drop?.(error);
        if (pid !== undefined) abandoned?.(pid);
        reject(error);
      });
    };
    let timer = setTimeout(expire, timeoutMs);
    handedOver = () => {
      clearTimeout(timer);
      generation++;
      read = bytesRead?.();
      timer = setTimeout(expire, timeoutMs);
    };
    run.then(
      (value) => {
        settled = true;
        clearTimeout(timer);
        resolve(value);
      },
      (error: unknown) => {
        settled = true;
        clearTimeout(timer);
        reject(error);
      },
    );
  });
}

/** A pooled statement's bound ran out: no connection, or no answer, within `timeoutMs` (the `cause` of the runner's error). */
export class NoAnswerInTime extends TypeORMError {}

/** pg-pool's queue of calls waiting for a connection (its own field), when it has one. */
function queueOf(pool: object): object[] | undefined {
  const queue = (pool as { _pendingQueue?: unknown })._pendingQueue;
  return Array.isArray(queue) ? (queue as object[]) : undefined;
}

/** The waiters `jumpQueue` moved. */
const urgentWaiters = new WeakSet<object>();

/**
 * Moves the waiter just queued (the last) forward: to the front, or, behind urgent ones already
 * waiting, one other waiter after the last of them, so that urgent waiters and the others take
 * turns. pg-pool serves its queue first come first served, and a storm of duplicates filled it
 * with claims: a held claim's renewal, a save and a release waited behind all of them, on a slow
 * database past the lease, and the claims were lost while their handlers ran (an adversarial
 * helper: up to 6 runs of one key; test/renewal-priority.e2e-spec.ts: 8 or 9 runs of each of 10
 * keys). Moved to the front every time, the renewals of many held claims on a slow database
 * (60 on a pool of 4, 30 ms a statement, 1 s leases) always had one waiting, and the app's own
 * queries, which those handlers waited for, were never served (a reviewing helper: still
 * waiting after 15 s). Taking turns, the others keep at least half the connections, in order.
 */
function jumpQueue(queue: object[]): void {
  const waiter = queue.pop()!;
  urgentWaiters.add(waiter);
  let last = queue.length - 1;
  while (last >= 0 && !urgentWaiters.has(queue[last]!)) last--;
  queue.splice(last < 0 ? 0 : Math.min(last + 2, queue.length), 0, waiter);
}

/** How long a bound past its time waits for more of an answer that is coming in (as the Redis store's). */
const PROGRESS_MS = 50;

/** How many times a claim statement runs when its snapshot keeps missing a concurrent commit. */
const CLAIM_ATTEMPTS = 10;

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
    // Statements racing on one key in lockstep can keep missing each other's commits (forgets
    // racing claims did, 5 times in a row under load): from the second miss, a short random pause.
    if (i >= 2 && i < CLAIM_ATTEMPTS) await new Promise((resolve) => setTimeout(resolve, Math.random() * i));
  }
  throw new IdempotencyStoreError(`PostgreSQL ${what} found no answer in ${CLAIM_ATTEMPTS} attempts`);
}

/**
 * Whether `error` is the answer to a statement on a connection that stays usable: a server error
 * (it has a severity), not FATAL or PANIC (those end the session; pg gives the severity in the
 * server's language, so a translated one is judged by its SQLSTATE alone), with a SQLSTATE other
 * than a connection failure (class 08) or an operator's intervention (57P). Anything else (pg's
 * `query_timeout`, "Connection terminated", a socket's error) may leave the connection broken or
 * still running the statement.
 */
export function isStatementError(error: unknown): boolean {
  const state = sqlStateOf(error);
  const shape = error as { severity?: unknown; driverError?: { severity?: unknown } } | undefined;
  const severity = shape?.driverError?.severity ?? shape?.severity;
  if (typeof severity !== 'string' || severity === 'FATAL' || severity === 'PANIC') return false;
  return typeof state === 'string' && !state.startsWith('08') && !state.startsWith('57P');
}

/** The SQLSTATE of a database error (TypeORM's `QueryFailedError` or pg's own), e.g. `40P01`. */
export function sqlStateOf(error: unknown): unknown {
  const shape = error as { code?: unknown; driverError?: { code?: unknown } } | undefined;
  return shape?.driverError?.code ?? shape?.code;
}

/** `value`, a positive number of milliseconds, or an `IdempotencyConfigError` naming `owner` and `name`. */
export function positiveMs(owner: string, name: string, value: number, max = MAX_TIMER_MS): number {
  if (!(typeof value === 'number' && Number.isFinite(value) && value > 0 && value <= max)) {
    throw new IdempotencyConfigError(`${owner}: ${name} must be a positive number of milliseconds, at most ${max.toLocaleString('en')}, got ${String(value)}`);
  }
  return value;
}

/**
 * The longest duration timed with a timer, in milliseconds (Node's longest): a longer
 * `statementTimeoutMs` failed every statement at once (an outage: fail-open routes ran every
 * copy), a longer `purgeIntervalMs` purged every millisecond (an adversarial helper).
 */
export const MAX_TIMER_MS = 2_147_483_647;
/** The longest retention, in milliseconds: 100 years (PostgreSQL's timestamps end). */
export const MAX_RETENTION_MS = 100 * 365 * 24 * 3600 * 1000;

/** `purgeIntervalMs` as given: undefined or 0 (no timed purge), else a timer's milliseconds. */
export function purgeIntervalMs(owner: string, value: number | undefined): number | undefined {
  return value === undefined || value === 0 ? value : positiveMs(owner, 'purgeIntervalMs', value);
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
