// The transactional mode on PostgreSQL: the claim row, the work's writes and the saved answer
// commit in ONE transaction, so that a crash leaves either nothing (the retry runs once) or
// everything (the retry replays). It writes `PostgresIdempotencyStore`'s table and row format
// (`../store/`): one migration, one purge, one key layout (`recordKey`), and a store claim of
// the same key waits for the transaction and then sees its answer.
//
// The consume log (`../helpers/consume-once.ts`) stays beside it, its own record kind: it keeps
// a `(consumer, message id)` row for as long as the user keeps it, with no answer, no expiry and
// no fingerprint, and tells a redelivery only `duplicate`. That is what a broker's redelivery
// needs (at most once per consumer, however late it comes). A record here holds an answer to
// replay for a retention and then expires, like the guard's: folding the log into it would give
// redeliveries a deadline after which they run again, or give the records table rows that never
// expire. A consumer whose caller waits for a reply (RPC) uses this class; one that only acks
// uses `consumeOnce`.
import { Logger, type FactoryProvider, type InjectionToken } from '@nestjs/common';
import { randomUUID } from 'node:crypto';
import { DataSource, type EntityManager, type QueryRunner } from 'typeorm';
import { IDEMPOTENCY_DEFAULTS, IdempotencyConfigError, IdempotencyError, IdempotencyKeyError, IdempotencyStoreError, isBlankText } from '../../index.js';
import { IDEMPOTENCY_RECORDS_TABLE } from '../store/idempotency-record.entity.js';
import { recordKey } from '../store/record-key.js';
import { coverNewConnections } from '../postgres/new-connections.js';
import { inWork, watchSideConnections, type WorkScope } from '../postgres/side-connections.js';
import { pinRepositories, refuseRoutedRepositories } from '../helpers/routed-repositories.js';
import { ExpiredRowsPurge, keptClaimsMs } from '../postgres/purge.js';
import { claimUntilAnswered, MAX_RETENTION_MS, postgresSchemaOf, positiveMs, sqlStateOf, statementRunner, type RunStatement } from '../postgres/statements.js';
import { entityTable, qualifiedTable } from '../postgres/table-name.js';
import type { IdempotentAnswer, IdempotentRunInput, IdempotentRunResult } from './idempotent-run.js';
import { boundWaitSql, claimSql, completeSql, restoreWaitSql } from './idempotent-transactions.sql.js';
import { bodyText, type SerializeBody } from './plain-body.js';

export interface IdempotentTransactionsOptions {
  /** How long a completed record is replayed, in milliseconds, from its save. Default 3,600,000 (the guard's `expireSeconds`). */
  retentionMs?: number;
  /**
   * Makes the work's body what the client sees, before it is saved (as JSON) and answered. The
   * record commits before Nest's `ClassSerializerInterceptor` sees the body, so by default, where
   * the app has class-transformer, each class instance without a `toJSON` keeps only what
   * `instanceToPlain` keeps (`@Exclude()` holds); `toJSON` is honoured. Give the serializer's own
   * options here when it has some: `(body) => instanceToPlain(body, { excludeExtraneousValues: true })`.
   */
  serialize?: (body: unknown) => unknown;
  /**
   * How long a duplicate waits for the transaction that holds its key, in milliseconds, before
   * it answers `in_progress` (sooner when the app's `statement_timeout` is shorter). The waiting
   * duplicate holds a pooled connection meanwhile. Default 3000.
   */
  lockTimeoutMs?: number;
  /** Table, `name` or `schema.name`. Default `idempotency_records` (the store's) in the DataSource's `schema`. */
  tableName?: string;
  /** How long `purgeExpired()` keeps the store's claims past their lease (see `PostgresIdempotencyStoreOptions.keepExpiredClaimsMs`; give both the same: the shorter wins). Default 600,000. */
  keepExpiredClaimsMs?: number;
}

interface ClaimRow {
  acquired: boolean;
  state: string | null;
  fingerprint: string | null;
  status_code: number | null;
  body: string | null;
  has_body: boolean | null;
  body_encoding: string | null;
  unreplayable: string | null;
  remaining_ms: number | null;
}

type Claim = { status: 'acquired' } | Exclude<IdempotentRunResult<unknown>, { status: 'ran' }>;

const DEFAULT_LOCK_TIMEOUT_MS = 3000;
/** PostgreSQL `lock_not_available`: `lock_timeout` ran out. */
const LOCK_NOT_AVAILABLE = '55P03';
/** PostgreSQL `query_canceled`: the app's `statement_timeout` (or a cancel) ended the claim's wait. */
const QUERY_CANCELED = '57014';
/** The longest fingerprint the table holds, in characters (`varchar(128)`). */
const MAX_FINGERPRINT_CHARS = 128;

/**
 * Why the table cannot hold a fingerprint as given, or undefined: the caller's mistake, said
 * before any statement (the database's refusal read as an outage). Over 128 characters (a
 * SHA-256 in hex is 64); a NUL (PostgreSQL text holds none); a lone surrogate (sent as UTF-8 it
 * becomes U+FFFD, so two fingerprints that differ would compare equal and a key reused with
 * another payload would be replayed).
 */
function fingerprintProblem(fingerprint: unknown): string | undefined {
  if (fingerprint === undefined) return undefined;
  if (typeof fingerprint !== 'string') return `is a ${typeof fingerprint}, not a string`;
  if (fingerprint.length > MAX_FINGERPRINT_CHARS && [...fingerprint].length > MAX_FINGERPRINT_CHARS) {
    return `is ${[...fingerprint].length} characters long; at most ${MAX_FINGERPRINT_CHARS} (a SHA-256 in hex is 64)`;
  }
  if (fingerprint.includes('\0')) return 'contains a NUL';
  if (/\p{Cs}/u.test(fingerprint)) return 'is not well-formed text (a lone surrogate)';
  return undefined;
}

/** PostgreSQL's in_failed_sql_transaction: a statement after one that failed, in the same transaction. */
const IN_FAILED_TRANSACTION = '25P02';

/** Saved with the answer, so a record reads like one the guard saved. */
const JSON_HEADERS = JSON.stringify({ 'content-type': 'application/json; charset=utf-8' });

/**
 * Runs an operation at most once per key on PostgreSQL, in ONE transaction: the claim row, the
 * work's writes (through the `EntityManager` it is given) and the answer commit together, or
 * nothing does.
 *
 * - A new key: the work runs and `ran` is answered.
 * - A committed answer in its retention: `replayed` (or `mismatch` when both fingerprints are
 *   set and differ), without running the work. An expired one is taken over and runs again.
 * - A duplicate while the first is running waits on its uncommitted row: it replays when the
 *   first commits, takes the key and runs when the first rolls back (an error, a crash), and
 *   answers `in_progress` after `lockTimeoutMs`. A live claim of `PostgresIdempotencyStore` on
 *   the key: `in_progress`.
 * - The work throws: everything rolls back (no record, no writes) and the error is rethrown.
 *
 * The work writes through the `EntityManager` it is given: a write through the DataSource (or a
 * repository of it) is another transaction, outside this promise.
 *
 * Runs in READ COMMITTED whatever the DataSource's isolation level (the claim needs each
 * statement's fresh snapshot); lock what the work reads if it needs more. If the COMMIT's answer
 * is lost (the connection drops), run again with the key: it replays or runs. Set the server's
 * `idle_in_transaction_session_timeout` so that a client cut off by the network does not hold a
 * key. Create the table with `IDEMPOTENCY_MIGRATIONS` (or `IDEMPOTENCY_STORE_MIGRATIONS`).
 * In Nest, register it with `provideIdempotentTransactions()`.
 */
export class IdempotentTransactions {
  /** How long a duplicate waits for the key's holder, in milliseconds. */
  readonly lockTimeoutMs: number;
  /** How long a completed record is replayed, in milliseconds. */
  readonly retentionMs: number;
  private readonly logger = new Logger(IdempotentTransactions.name);
  private readonly sql: Record<'claim' | 'complete', string>;
  private readonly statement: RunStatement;
  private readonly purge: ExpiredRowsPurge;
  private readonly serialize: SerializeBody | undefined;
  /** Says, once, that a work asked the pool for a connection of its own (see `watchSideConnections`). */
  private readonly sayAsked: () => void;

  constructor(
    readonly dataSource: DataSource,
    options: IdempotentTransactionsOptions = {},
  ) {
    const schema = postgresSchemaOf('IdempotentTransactions', dataSource);
    this.retentionMs = positiveMs('IdempotentTransactions', 'retentionMs', options.retentionMs ?? IDEMPOTENCY_DEFAULTS.expireSeconds * 1000, MAX_RETENTION_MS);
    // lock_timeout counts whole milliseconds, and 0 would mean no bound at all.
    this.lockTimeoutMs = Math.ceil(positiveMs('IdempotentTransactions', 'lockTimeoutMs', options.lockTimeoutMs ?? DEFAULT_LOCK_TIMEOUT_MS));
    this.statement = statementRunner(dataSource);
    let said = false;
    this.sayAsked = () => {
      if (said) return;
      said = true;
      this.logger.warn(
        'a work of IdempotentTransactions.run asked the pool for a connection of its own (a repository injected with @InjectRepository ' +
          'or taken from the DataSource, dataSource.query, dataSource.transaction): what it writes there is outside the run\'s ' +
          'transaction (a failure after it leaves it, and the retry writes it again), and when every connection of the pool is held ' +
          `such an ask fails after lockTimeoutMs (${this.lockTimeoutMs} ms) instead of waiting for a connection no run frees. ` +
          'Use the EntityManager the work is given, for reads too. Said once.',
      );
    };
    if (options.serialize !== undefined && typeof options.serialize !== 'function') {
      throw new IdempotencyConfigError(`IdempotentTransactions: serialize must be a function (got ${typeof options.serialize})`);
    }
    this.serialize = options.serialize;
    const table = qualifiedTable(options.tableName ?? entityTable(dataSource.options, IDEMPOTENCY_RECORDS_TABLE), schema);
    this.sql = { claim: claimSql(table), complete: completeSql(table) };
    this.purge = new ExpiredRowsPurge({
      run: this.statement,
      table,
      idColumn: 'key',
      keepExpiredClaimsMs: keptClaimsMs('IdempotentTransactions', options.keepExpiredClaimsMs),
      logger: this.logger,
      what: 'idempotency records',
    });
  }

  /**
   * Runs `work` once for `input.key`: claims the key, runs `work` with the transaction's
   * `EntityManager` and saves its answer, in one transaction; or answers from what holds the key.
   * Rethrows what `work` throws, after the rollback; a `statusCode` that is not an integer from
   * 200 to 599 is a `RangeError`, after the rollback too. Throws `IdempotencyStoreError` when the
   * database fails, `IdempotencyKeyError` for an empty or blank key (white space or invisible
   * characters only), one with a lone surrogate or a NUL,
   * and `IdempotencyError` for a fingerprint the table cannot hold as given (see `fingerprintProblem`).
   */
  async run<T>(input: IdempotentRunInput, work: (manager: EntityManager) => Promise<IdempotentAnswer<T>>): Promise<IdempotentRunResult<T>> {
    if (typeof input.key !== 'string' || input.key === '') throw new IdempotencyKeyError('empty');
    // Every blank key would be one operation: the second call answered the first's body.
    if (isBlankText(input.key)) throw new IdempotencyKeyError('it is only white space or invisible characters');
    // Sent as UTF-8, every lone surrogate is U+FFFD (two such keys would be one); PostgreSQL text holds no NUL.
    if (/\p{Cs}/u.test(input.key)) throw new IdempotencyKeyError('it is not well-formed text: a lone surrogate');
    if (input.key.includes('\0')) throw new IdempotencyKeyError('it contains a NUL');
    const problem = fingerprintProblem(input.fingerprint);
    if (problem) throw new IdempotencyError(`IdempotentTransactions.run: the fingerprint ${problem}`);
    refuseRoutedRepositories(this.dataSource, 'IdempotentTransactions.run', 'its record, replayed to every retry,');
    const key = recordKey(input.key);
    const token = randomUUID();
    coverNewConnections(this.dataSource);
    watchSideConnections(this.dataSource);
    const runner = this.dataSource.createQueryRunner();
    try {
      await database('START TRANSACTION', () => runner.startTransaction('READ COMMITTED'));
      const claim = await this.claim(runner, key, token, input);
      if (claim.status !== 'acquired') {
        await database('ROLLBACK', () => runner.rollbackTransaction());
        return claim as IdempotentRunResult<T>;
      }
      const scope: WorkScope = { boundMs: this.lockTimeoutMs, running: true, askedForConnection: this.sayAsked };
      let answer: IdempotentAnswer<T>;
      try {
        answer = await inWork(scope, () => work(pinRepositories(runner.manager)));
      } finally {
        // A timer or a loop the work started keeps its async context: its later asks are not the run's.
        scope.running = false;
      }
      const { statusCode = 200, body } = answer;
      if (!Number.isInteger(statusCode) || statusCode < 200 || statusCode > 599) {
        // Saved as given, 0 or '201' answered 500 to the first client and a number to every replay, the effect committed.
        throw new RangeError(`IdempotentTransactions.run: the work's statusCode must be an integer from 200 to 599, got ${typeof statusCode === 'string' ? JSON.stringify(statusCode) : String(statusCode)}; nothing was committed`);
      }
      const text = await bodyText(body, this.serialize);
      const params = [key, token, statusCode, JSON_HEADERS, text ?? null, text !== undefined, this.retentionMs];
      // The work ended the transaction through its QueryRunner: its writes committed with the
      // claim, not the answer, and each duplicate took the key over and ran again (an adversarial
      // helper: 7 to 11 effects for 20 duplicates; the first got "Transaction is not started yet").
      if (!runner.isTransactionActive) {
        throw new IdempotencyConfigError(
          "IdempotentTransactions.run: the work ended the run's transaction itself (commitTransaction or rollbackTransaction on its " +
            'QueryRunner): what it wrote went without the answer, and a retry runs it again. Leave the transaction to run',
        );
      }
      if ((await this.complete(params, runner)).affected !== 1) {
        throw new IdempotencyStoreError(`The claim of ${JSON.stringify(input.key)} was lost inside its transaction`);
      }
      // A COMMIT whose answer is lost throws: the caller does not know; its retry replays or runs.
      await commit(runner);
      return { status: 'ran', statusCode, body: (text === undefined ? undefined : JSON.parse(text)) as T };
    } catch (error) {
      // The original error matters, not a failed rollback's (the connection may be gone).
      if (runner.isTransactionActive) await runner.rollbackTransaction().catch(() => undefined);
      throw error;
    } finally {
      await runner.release();
    }
  }

  /**
   * The save of the answer. A work that caught a failed statement and went on left the transaction
   * aborted: said as the work's mistake, not as a store outage (an app that answers those 503 had
   * its clients retry for ever, an adversarial helper).
   */
  private async complete(params: unknown[], runner: QueryRunner): Promise<{ affected?: number }> {
    try {
      return await this.statement(this.sql.complete, params, runner);
    } catch (error) {
      if (sqlStateOf((error as Error).cause) !== IN_FAILED_TRANSACTION) throw error;
      throw new IdempotencyConfigError(
        'IdempotentTransactions.run: a statement of the work failed and the work went on (it caught the error), but PostgreSQL had ' +
          'aborted the transaction, so nothing was committed. Run a statement that may fail in a savepoint (manager.transaction(...)), ' +
          'as insertOnce does, or let its error end the work',
        { cause: error },
      );
    }
  }

  /** Deletes expired records of the table (the store's too: one table, one purge); returns how many. */
  purgeExpired(): Promise<number> {
    return this.purge.purgeExpired();
  }

  /** The claim, its wait bounded by `lockTimeoutMs`, the app's `lock_timeout` restored after it. */
  private async claim(runner: QueryRunner, key: string, token: string, input: IdempotentRunInput): Promise<Claim> {
    const fingerprint = input.fingerprint ?? '';
    const bound = await this.statement(boundWaitSql, [`${this.lockTimeoutMs}ms`], runner);
    const [{ previous }] = bound.records as { previous: string }[];
    let claim: Claim;
    try {
      claim = await claimUntilAnswered<Claim>(`transactional claim of ${JSON.stringify(input.key)}`, async () => {
        const [row] = (await this.statement(this.sql.claim, [key, token, fingerprint], runner)).records as ClaimRow[];
        return row && answerOf(row, fingerprint, input.key);
      });
    } catch (error) {
      // The holder's transaction outlived the wait (ours, or the app's statement_timeout when
      // shorter); when it ends is unknown, so suggest the wait again. The cancelled claim wrote nothing.
      const state = sqlStateOf((error as Error).cause);
      if (state === LOCK_NOT_AVAILABLE || state === QUERY_CANCELED) return { status: 'in_progress', retryAfterMs: this.lockTimeoutMs };
      throw error;
    }
    if (claim.status === 'acquired') await this.statement(restoreWaitSql, [previous], runner);
    return claim;
  }
}

/**
 * A Nest provider of `IdempotentTransactions` on the DataSource behind `dataSource` (default: the
 * `DataSource` class, the token of `TypeOrmModule.forRoot`'s default DataSource; for a named one,
 * `getDataSourceToken(name)`). Inject it by its class.
 */
export function provideIdempotentTransactions(
  options: IdempotentTransactionsOptions = {},
  dataSource: InjectionToken = DataSource,
): FactoryProvider<IdempotentTransactions> {
  return {
    provide: IdempotentTransactions,
    useFactory: (source: DataSource) => new IdempotentTransactions(source, options),
    inject: [dataSource],
  };
}

function answerOf(row: ClaimRow, fingerprint: string, key: string): Claim {
  if (row.acquired) return { status: 'acquired' };
  if (fingerprint !== '' && row.fingerprint !== '' && row.fingerprint !== fingerprint) return { status: 'mismatch' };
  if (row.state !== 'completed') return { status: 'in_progress', retryAfterMs: Math.max(Number(row.remaining_ms ?? 0), 0) };
  if (row.body_encoding !== null || row.unreplayable !== null) {
    // Only the guard writes these: it used this key too, and its answer is not a run's.
    throw new IdempotencyStoreError(`The record of ${JSON.stringify(key)} holds an answer of the guard, not of a transactional run`);
  }
  let body: unknown;
  try {
    body = row.has_body ? JSON.parse(row.body ?? '') : undefined;
  } catch (error) {
    throw new IdempotencyStoreError(`The record of ${JSON.stringify(key)} holds no JSON body: the guard used this key too`, { cause: error });
  }
  return { status: 'replayed', statusCode: row.status_code ?? 200, body };
}

/** Runs one transaction command of TypeORM's runner; a failure is the database's: `IdempotencyStoreError`. */
/**
 * Commits the run's transaction. A constraint the COMMIT checks (`DEFERRABLE INITIALLY DEFERRED`)
 * or a serialization failure there is the work's failure: everything rolled back, thrown as the
 * database gave it, as the work's own errors are. Wrapped as a store error, a business conflict
 * read as an outage (an app maps those to 503), and `uniqueViolationOf()` found nothing in it
 * (an adversarial helper). Anything else (the answer lost with the connection) is a store error.
 */
async function commit(runner: QueryRunner): Promise<void> {
  try {
    await runner.commitTransaction();
  } catch (error) {
    const state = sqlStateOf(error);
    if (typeof state === 'string' && (state.startsWith('23') || state.startsWith('40'))) throw error;
    throw new IdempotencyStoreError(`PostgreSQL COMMIT failed: ${(error as Error).message}`, { cause: error });
  }
}

async function database(command: string, call: () => Promise<void>): Promise<void> {
  try {
    await call();
  } catch (error) {
    // A run nested in another's work, refused a connection (see watchSideConnections): the app's mistake, not an outage.
    if (error instanceof IdempotencyConfigError) throw error;
    throw new IdempotencyStoreError(`PostgreSQL ${command} failed: ${(error as Error).message}`, { cause: error });
  }
}


