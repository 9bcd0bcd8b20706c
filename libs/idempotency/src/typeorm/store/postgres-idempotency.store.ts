import { Logger, type OnApplicationShutdown, type OnModuleInit } from '@nestjs/common';
import type { DataSource } from 'typeorm';
import {
  IdempotencyConfigError,
  IdempotencyStore,
  type ClaimInput,
  type ClaimResult,
  type ForgetResult,
  type SavedResponse,
  type StoredRecord,
  type UnreplayableReason,
} from '../../index.js';
import { IDEMPOTENCY_RECORDS_TABLE } from './idempotency-record.entity.js';
import { claimManySql, claimSql, completeAfterLeaseSql, completeManySql, completeSql, forgetSql, getSql, releaseSql, renewLockedSql, renewSql } from './postgres-idempotency.sql.js';
import { recordKey } from './record-key.js';
import { batchedStatement } from '../postgres/batched-statement.js';
import { ExpiredRowsPurge, keptClaimsMs } from '../postgres/purge.js';
import { claimUntilAnswered, positiveMs, postgresSchemaOf, purgeIntervalMs, sqlStateOf, statementRunner, type RunStatement } from '../postgres/statements.js';
import { entityTable, qualifiedTable } from '../postgres/table-name.js';

export interface PostgresIdempotencyStoreOptions {
  /**
   * Table of the records, `name` or `schema.name`. Default `idempotency_records` in the
   * DataSource's `schema` (or the search path). Another name needs its own migration.
   */
  tableName?: string;
  /**
   * Deletes expired records every this many milliseconds, from `onModuleInit` until
   * `onApplicationShutdown` (the timer does not keep the process alive). Default: never; call
   * `purgeExpired()` from your own scheduler instead, or run both.
   */
  purgeIntervalMs?: number;
  /** Rows one purge statement deletes at most. Default 1000. */
  purgeBatchSize?: number;
  /**
   * How long the purge keeps a claim past the end of its lease, in milliseconds: a run whose save
   * came late (a busy pool) still saves into its expired claim (`completeAfterLease`), trying for
   * up to the guard's `maxHoldSeconds`, and once the purge deleted the claim the key is free and
   * a retry runs again. Default 600,000: twice the default `maxHoldSeconds` (a run whose lease was
   * lost early may run that long before it tries); keep it at least twice yours, and the same in
   * `IdempotentTransactions` when both purge (the shorter wins). At most a year. Completed
   * records are purged when their retention ends, whatever this says.
   */
  keepExpiredClaimsMs?: number;
  /**
   * How long one operation waits for a free connection, and then for its statement's answer, in
   * milliseconds (each). Past it the operation fails as a store outage (the route's `failMode` decides),
   * and the connection it waited on leaves the pool. Default 5000: above a loaded database's
   * commits, and a claim's wait for a transactional run of the same key (`IdempotentTransactions`)
   * counts against it.
   */
  statementTimeoutMs?: number;
}

/** Ends server process $1 (waiting up to $3 ms until it has exited) if it still runs statement text $2. */
const TERMINATE_ABANDONED_SQL = `SELECT pg_terminate_backend(a.pid, $3) AS ended
  FROM pg_stat_activity AS a
 WHERE a.pid = $1 AND a.state = 'active' AND a.query <> '' AND left($2::text, length(a.query)) = a.query`;

/** Every column the store reads or writes (the start-up check selects them). */
const RECORD_COLUMNS = ['key', 'state', 'token', 'fingerprint', 'status_code', 'headers', 'body', 'has_body', 'body_encoding', 'unreplayable', 'expires_at'];

/** What the first check's error says of a table that cannot hold records: missing (or its schema), a column missing, no privilege. */
const TABLE_UNFIT_STATES = new Set(['42P01', '42703', '3F000', '42501']);

/** Whether the role may write the table $1, the session may write, and the table has a unique index on "key" alone. */
const TABLE_FIT_SQL = `SELECT has_table_privilege(t.oid, 'SELECT') AND has_table_privilege(t.oid, 'INSERT')
         AND has_table_privilege(t.oid, 'UPDATE') AND has_table_privilege(t.oid, 'DELETE') AS writable,
       current_setting('transaction_read_only') = 'on' AS read_only,
       EXISTS (SELECT 1 FROM pg_index i JOIN pg_attribute a ON a.attrelid = i.indrelid AND a.attnum = i.indkey[0]
                WHERE i.indrelid = t.oid AND i.indisunique AND i.indnkeyatts = 1 AND i.indpred IS NULL AND a.attname = 'key') AS keyed
  FROM (SELECT $1::regclass::oid AS oid) AS t`;

/** `statementTimeoutMs` by default. */
const DEFAULT_STATEMENT_TIMEOUT_MS = 5000;

interface ClaimRow {
  acquired: boolean;
  state: string | null;
  fingerprint: string | null;
  status_code: number | null;
  headers: Record<string, string> | null;
  body: string | null;
  has_body: boolean | null;
  body_encoding: string | null;
  unreplayable: string | null;
  remaining_ms: number | null;
}

interface RecordRow extends Omit<ClaimRow, 'acquired' | 'remaining_ms'> {
  token: string;
  ttl_ms: number;
}

/** A renewal whose row was locked goes again this long after (ms), doubling each time up to `LOCKED_RETRY_MAX_MS`. */
const LOCKED_RETRY_MS = 10;
const LOCKED_RETRY_MAX_MS = 250;
/** PostgreSQL `lock_not_available`: `lock_timeout` ran out. */
const LOCK_NOT_AVAILABLE = '55P03';

/** A renewal waiting to go out with the others due (`PostgresIdempotencyStore.renew`). */
interface PendingRenewal {
  key: string;
  token: string;
  leaseMs: number;
  /** Statements that found its row locked by another transaction. */
  locked: number;
  /** Told when a statement carrying it goes out (`IdempotencyStore.renew`). */
  sent?: () => void;
  resolve(renewed: boolean): void;
  reject(error: unknown): void;
}

/**
 * PostgreSQL store on a logged table: survives restarts and needs no Redis. Each operation is one
 * SQL statement (one round trip) on the DataSource's pool (the primary's, with replication), a
 * prepared statement planned once per connection (`../postgres/statements.ts`), each time taken
 * from the database clock, so application servers with skewed clocks agree. Each is bounded by
 * `statementTimeoutMs` (default 5 s), as the Redis store bounds its commands. Create the table with
 * `IDEMPOTENCY_MIGRATIONS`. Keys of any length work: one over 1,020 UTF-8 bytes is stored as a
 * readable head and its SHA-256 (`recordKey`).
 */
export class PostgresIdempotencyStore extends IdempotencyStore implements OnModuleInit, OnApplicationShutdown {
  private readonly logger = new Logger(PostgresIdempotencyStore.name);
  private readonly sql: Record<'claim' | 'complete' | 'completeAfterLease' | 'release' | 'renew' | 'renewLocked' | 'forget' | 'get', string>;
  private readonly run: RunStatement;
  /** For the statements of a held claim (renew, save, release): ahead of the pool's other waiters. */
  private readonly runHeld: RunStatement;
  /** Ends server processes whose statement was given up on (its own statements are not watched). */
  private readonly terminate: RunStatement;
  /** Those endings in flight: a release or a save waits for them (see `endAbandoned`). */
  private readonly ending = new Set<Promise<unknown>>();
  private readonly timeoutMs: number;
  private readonly purgeSchedule: ExpiredRowsPurge;
  /** The records' table, quoted for SQL. */
  private readonly table: string;
  /** Claims, many in a statement on a busy store (`batchedStatement`). */
  private readonly claimMany: (call: ClaimCall) => Promise<ClaimRow>;
  /** Saves of held claims, many in a statement on a busy store. */
  private readonly completeMany: (params: unknown[]) => Promise<boolean>;

  constructor(
    readonly dataSource: DataSource,
    options: PostgresIdempotencyStoreOptions = {},
  ) {
    super();
    const schema = postgresSchemaOf('PostgresIdempotencyStore', dataSource);
    const timeoutMs = positiveMs('PostgresIdempotencyStore', 'statementTimeoutMs', options.statementTimeoutMs ?? DEFAULT_STATEMENT_TIMEOUT_MS);
    this.timeoutMs = timeoutMs;
    this.run = statementRunner(dataSource, { timeoutMs, abandoned: (pid, sql) => this.endAbandoned(pid, sql) });
    // A held claim's statements wait for the next free connection, not behind a storm of claims.
    this.runHeld = statementRunner(dataSource, { timeoutMs, abandoned: (pid, sql) => this.endAbandoned(pid, sql), urgent: true });
    this.terminate = statementRunner(dataSource, { timeoutMs, showsProgress: false });
    const table = qualifiedTable(options.tableName ?? entityTable(dataSource.options, IDEMPOTENCY_RECORDS_TABLE), schema);
    this.table = table;
    this.claimMany = batchedStatement({
      run: this.run,
      sql: claimManySql(table),
      row: (call) => sentText(call.key),
      params: (calls) => [calls.map((call) => call.key), calls.map((call) => call.token), calls.map((call) => call.fingerprint), calls.map((call) => call.leaseMs)],
      answers: (result, calls) => {
        const rows = new Map((result.records as ManyClaimRow[]).map((row) => [Number(row.n), row]));
        return calls.map((_, i) => {
          const row = rows.get(i + 1);
          if (!row) return NO_ANSWER;
          // The body comes once a key, on its first claim's row.
          if (row.has_body && Number(row.first) !== i + 1) row.body = rows.get(Number(row.first))!.body;
          return row;
        });
      },
      boundMs: timeoutMs,
      alone: async ({ key, token, fingerprint, leaseMs }) => {
        const [row] = (await this.run(this.sql.claim, [key, token, fingerprint, leaseMs])).records as ClaimRow[];
        return row ?? NO_ANSWER;
      },
    });
    this.completeMany = batchedStatement({
      run: this.runHeld,
      sql: completeManySql(table),
      // A save changes its owner's row only (it matches the token): saves of one key by other
      // owners (a fail-open route's duplicates whose claims failed) need not wait for each other.
      row: (save) => JSON.stringify([sentText(save[0] as string), sentText(save[1] as string)]),
      distinctRows: true,
      weight: (save) => ((save[4] as string | null)?.length ?? 0) + (save[3] as string).length,
      params: (saves) => saves[0]!.map((_, column) => saves.map((save) => save[column])),
      answers: (result, saves) => {
        const made = new Set((result.records as { n: string | number }[]).map((row) => Number(row.n)));
        return saves.map((_, i) => made.has(i + 1));
      },
      boundMs: timeoutMs,
      alone: async (params) => (await this.runHeld(this.sql.complete, params)).affected === 1,
    });
    this.sql = {
      claim: claimSql(table),
      complete: completeSql(table),
      completeAfterLease: completeAfterLeaseSql(table),
      release: releaseSql(table),
      renew: renewSql(table),
      renewLocked: renewLockedSql(table),
      forget: forgetSql(table),
      get: getSql(table),
    };
    this.purgeSchedule = new ExpiredRowsPurge({
      run: this.run,
      table,
      idColumn: 'key',
      batchSize: options.purgeBatchSize,
      intervalMs: purgeIntervalMs('PostgresIdempotencyStore', options.purgeIntervalMs),
      keepExpiredClaimsMs: keptClaimsMs('PostgresIdempotencyStore', options.keepExpiredClaimsMs),
      logger: this.logger,
      what: 'idempotency records',
    });
  }

  claim({ key, token, fingerprint, leaseMs }: ClaimInput): Promise<ClaimResult> {
    const call: ClaimCall = { key: recordKey(key), token, fingerprint, leaseMs };
    return claimUntilAnswered<ClaimResult>(`claim of ${JSON.stringify(key)}`, async () => {
      const row = await this.claimMany(call);
      if (!row.acquired && row.state === null) return undefined;
      if (row.acquired) return { status: 'acquired', token };
      if (fingerprint !== '' && row.fingerprint !== '' && row.fingerprint !== fingerprint) return { status: 'mismatch' };
      if (row.state === 'completed') return { status: 'completed', response: toSaved(row) };
      return { status: 'in_progress', retryAfterMs: Math.max(row.remaining_ms ?? 0, 0) };
    });
  }

  async complete(key: string, token: string, response: SavedResponse, retentionMs: number): Promise<boolean> {
    if (this.ending.size > 0) await Promise.all(this.ending);
    return this.completeMany(saveParams(key, token, response, retentionMs));
  }

  /** The expired claim's row is kept (until a claim takes it, or the purge): its token tells. */
  override async completeAfterLease(key: string, token: string, response: SavedResponse, retentionMs: number): Promise<boolean> {
    return this.save(this.sql.completeAfterLease, key, token, response, retentionMs);
  }

  private async save(sql: string, key: string, token: string, response: SavedResponse, retentionMs: number): Promise<boolean> {
    if (this.ending.size > 0) await Promise.all(this.ending);
    return (await this.runHeld(sql, saveParams(key, token, response, retentionMs))).affected === 1;
  }

  async release(key: string, token: string): Promise<boolean> {
    if (this.ending.size > 0) await Promise.all(this.ending);
    return (await this.runHeld(this.sql.release, [recordKey(key), token])).affected === 1;
  }

  /**
   * Renewals due, not yet sent: they go together in the next statement, made when the pool hands
   * it a connection. One renewal each, on a pool the handlers share, took turns with their
   * queries one by one: with 40 claims held on a pool of 2, the last renewals waited behind 40
   * handler transactions of 150 ms, missed their 2 s leases, and duplicates ran those handlers
   * again (an adversarial helper: the same with 60 claims, 0.4 s and the default 10 s lease).
   * Together they take one turn, whatever the number of claims held.
   */
  private renewals: PendingRenewal[] = [];
  /** A statement waits for a connection, to carry `renewals`. */
  private renewalsWaiting = false;

  renew(key: string, token: string, leaseMs: number, sent?: () => void): Promise<boolean> {
    return new Promise((resolve, reject) => {
      this.renewals.push({ key: recordKey(key), token, leaseMs, locked: 0, sent, resolve, reject });
      if (!this.renewalsWaiting) this.sendRenewals();
    });
  }

  /** Sends the renewals due when the statement gets its connection; those due later wait for the next one. */
  private sendRenewals(): void {
    this.renewalsWaiting = true;
    let sent: PendingRenewal[] | undefined;
    const take = () => {
      this.renewalsWaiting = false;
      const taken = this.renewals;
      this.renewals = [];
      return taken;
    };
    const params = () => {
      sent = take();
      for (const renewal of sent) renewal.sent?.();
      return [sent.map((renewal) => renewal.key), sent.map((renewal) => renewal.token), sent.map((renewal) => renewal.leaseMs)];
    };
    this.runHeld(this.sql.renew, params).then(
      ({ records }) => {
        // By position: a key PostgreSQL sends back may not be the string sent (a lone surrogate comes back as U+FFFD).
        const held = new Map((records as { n: string | number; renewed: boolean }[]).map((row) => [Number(row.n), row.renewed]));
        sent!.forEach((renewal, i) => {
          const renewed = held.get(i + 1);
          if (renewed === false) this.renewLater(renewal);
          else renewal.resolve(renewed === true);
        });
      },
      // The renewals it carried fail with it; failed before it went out (no connection in time), those waiting for it.
      (error: unknown) => {
        for (const renewal of sent ?? take()) renewal.reject(error);
      },
    );
  }

  /** Renewals waiting for their row's lock (`renewLockedSql`), each on a connection. */
  private lockWaits = 0;
  /** Locked renewals to go again in a later statement of many, with the timers that send them. */
  private readonly lockedLater = new Map<PendingRenewal, NodeJS.Timeout>();

  /**
   * A claim whose row another transaction holds locked. Skipped once, it goes again in the next
   * statements of many, soon (a duplicate's claim locks a held row for an instant). Skipped again,
   * it waits for the lock in the row's queue (`renewLockedSql`), on a connection of its own: at
   * most half the pool's connections wait so (at least one), so that as many locked rows as the
   * pool has connections never hold every renewal and every claim (2 rows locked for long on a
   * pool of 2: keys ran up to 5 times; an adversarial helper). Past those, it goes again in the
   * statements of many, backing off. Once a wait gets its lock (the lock's holder ended), the
   * other locked renewals go at once.
   */
  private renewLater(renewal: PendingRenewal): void {
    renewal.locked++;
    if (renewal.locked > 1 && this.lockWaits < this.lockWaitSlots()) return this.waitForLock(renewal);
    const delayMs = Math.min(LOCKED_RETRY_MS * 2 ** (renewal.locked - 1), LOCKED_RETRY_MAX_MS);
    const timer = setTimeout(() => this.sendLockedLater([renewal]), delayMs);
    timer.unref();
    this.lockedLater.set(renewal, timer);
  }

  private sendLockedLater(sent: PendingRenewal[]): void {
    for (const renewal of sent) {
      clearTimeout(this.lockedLater.get(renewal));
      this.lockedLater.delete(renewal);
      this.renewals.push(renewal);
    }
    if (sent.length > 0 && !this.renewalsWaiting) this.sendRenewals();
  }

  private waitForLock(renewal: PendingRenewal): void {
    this.lockWaits++;
    // Bounded well inside the statement's own bound, which would end the server process.
    const params = () => {
      renewal.sent?.();
      return [renewal.key, renewal.token, renewal.leaseMs, Math.floor(this.timeoutMs / 2)];
    };
    this.runHeld(this.sql.renewLocked, params).then(
      ({ affected }) => {
        this.lockWaits--;
        renewal.resolve(affected === 1);
        this.sendLockedLater([...this.lockedLater.keys()]);
      },
      (error: unknown) => {
        this.lockWaits--;
        if (sqlStateOf((error as Error).cause) === LOCK_NOT_AVAILABLE) this.renewLater(renewal);
        else renewal.reject(error);
      },
    );
  }

  /** Half the pool's connections, at least one. */
  private lockWaitSlots(): number {
    const max = (this.dataSource.driver as unknown as { master?: { options?: { max?: number } } }).master?.options?.max ?? 10;
    return Math.max(1, Math.floor(max / 2));
  }

  override forget(key: string): Promise<ForgetResult> {
    // PostgreSQL text holds no NUL: no record has such a key (an operator's pasted one failed as an outage).
    if (key.includes('\0')) return Promise.resolve({ forgotten: false, reason: 'absent' });
    return claimUntilAnswered<ForgetResult>(`forget of ${JSON.stringify(key)}`, async () => {
      const [row] = (await this.run(this.sql.forget, [recordKey(key)])).records as { deleted: number; state: string | null }[];
      if (row.deleted === 1) return { forgotten: true };
      if (row.state === null) return { forgotten: false, reason: 'absent' };
      if (row.state === 'processing') return { forgotten: false, reason: 'in_progress' };
      return undefined;
    });
  }

  async get(key: string): Promise<StoredRecord | undefined> {
    if (key.includes('\0')) return undefined; // see forget()
    const [row] = (await this.run(this.sql.get, [recordKey(key)])).records as RecordRow[];
    if (!row) return undefined;
    const state = row.state === 'completed' ? 'completed' : 'processing';
    return {
      state,
      token: row.token,
      fingerprint: row.fingerprint ?? '',
      response: state === 'completed' ? toSaved(row) : undefined,
      ttlMs: row.ttl_ms,
    };
  }

  /**
   * A statement given up on past the bound may still run on the server: a claim waiting for a
   * lock lands when it gets it, after the guard answered 503 and released the key, and holds it
   * for a lease with no handler running. So its server process is ended
   * (`pg_terminate_backend`, which waits until it has exited), and releases and saves wait for
   * that: by then the claim has landed or never will, and the release deletes what landed. Only
   * a process still running that statement's text (`pg_stat_activity`, whose text may be cut
   * short): behind a pooler the process id the connection reported is the pooler's, and may be
   * another session's on the server.
   */
  private endAbandoned(pid: number, sql: string): void {
    const ended = this.terminate(TERMINATE_ABANDONED_SQL, [pid, sql, this.timeoutMs]).catch(() => undefined);
    this.ending.add(ended);
    void ended.then(() => this.ending.delete(ended));
  }

  /** Deletes expired records, in batches of `purgeBatchSize`; returns how many. */
  purgeExpired(): Promise<number> {
    return this.purgeSchedule.purgeExpired();
  }

  private uncheckedTable(error: unknown): void {
    this.logger.warn(`could not check the table ${this.table} at start-up: ${(error as Error).message}`);
  }

  /**
   * Checks the table, then starts the purge. A table that is missing, lacks a migration's
   * columns, a unique key or the privileges the store needs, or a read-only session, refuses start-up: every claim would fail, and a route that fails open would run
   * every duplicate (an adversarial helper: 150 parallel duplicates, 150 runs). A database that
   * does not answer is only logged: the routes' `failMode` decides, as for any outage.
   */
  async onModuleInit(): Promise<void> {
    if (this.dataSource.isInitialized) await this.checkTable();
    else this.logger.warn('the DataSource is not initialized at start-up, so the records\' table was not checked: initialize it before the app (TypeOrmModule does)');
    this.purgeSchedule.start();
  }

  /**
   * The table must have every column, a unique key, and the privileges to claim, complete and
   * forget, on a session that may write (a read-only replica's may not). An adversarial helper:
   * a table without SELECT, or only with it, on a read-only session, or without a unique `key`
   * started, and failing open ran 150 of 150 duplicates.
   */
  private async checkTable(): Promise<void> {
    let problem: string | undefined;
    try {
      await this.run(`SELECT ${RECORD_COLUMNS.map((column) => `"${column}"`).join(', ')} FROM ${this.table} LIMIT 0`, []);
    } catch (error) {
      const cause = (error as Error).cause;
      if (!TABLE_UNFIT_STATES.has(sqlStateOf(cause) as string)) return this.uncheckedTable(error);
      problem = (cause as Error).message;
    }
    if (problem === undefined) {
      try {
        const [row] = (await this.run(TABLE_FIT_SQL, [this.table])).records as { writable: boolean; read_only: boolean; keyed: boolean }[];
        if (row && !row.writable) problem = 'the role lacks SELECT, INSERT, UPDATE or DELETE on it';
        else if (row?.read_only) problem = 'the session is read-only (a replica, or default_transaction_read_only)';
        else if (row && !row.keyed) problem = 'its "key" column has no unique index (a claim needs one to tell the first request)';
      } catch (error) {
        return this.uncheckedTable(error);
      }
    }
    if (problem !== undefined) {
      throw new IdempotencyConfigError(
        `PostgresIdempotencyStore: the table ${this.table} cannot hold records (${problem}). Run IDEMPOTENCY_MIGRATIONS ` +
          `(nestjs-idempotency/typeorm) on this DataSource, with a role that may write it, or name the table with tableName`,
      );
    }
  }

  async onApplicationShutdown(): Promise<void> {
    // The DataSource closes after its module shuts down; let a running purge finish first.
    await this.purgeSchedule.stop();
  }
}

/** A claim's row when its statement's snapshot missed the record that refused it: run it again. */
const NO_ANSWER = { acquired: false, state: null } as ClaimRow;

/** A row of `claimManySql`: a claim's `n`, and its key's first claim's. */
interface ManyClaimRow extends ClaimRow {
  n: string | number;
  first: string | number;
}

/** One claim's parameters (`claimManySql`). */
interface ClaimCall {
  key: string;
  token: string;
  fingerprint: string;
  leaseMs: number;
}

/** A key as PostgreSQL reads it: the driver sends a lone surrogate as U+FFFD. */
function sentText(key: string): string {
  return (key as string & { toWellFormed(): string }).toWellFormed();
}

/** The parameters of a save (`completeSql`), in its order. */
function saveParams(key: string, token: string, response: SavedResponse, retentionMs: number): unknown[] {
  const { statusCode, headers, body, encoding, unreplayable } = response;
  const hasBody = body !== undefined;
  return [recordKey(key), token, statusCode, JSON.stringify(headers), hasBody ? body : null, hasBody, retentionMs, encoding ?? null, unreplayable ?? null];
}

type ResponseColumns = 'status_code' | 'headers' | 'body' | 'has_body' | 'body_encoding' | 'unreplayable';

function toSaved(row: Pick<ClaimRow, ResponseColumns>): SavedResponse {
  const response: SavedResponse = { statusCode: row.status_code ?? 0, headers: row.headers ?? {} };
  if (row.has_body) response.body = row.body ?? '';
  // Absent stays absent: a NULL column sets no field.
  if (row.body_encoding !== null) response.encoding = row.body_encoding as 'base64';
  if (row.unreplayable !== null) response.unreplayable = row.unreplayable as UnreplayableReason;
  return response;
}
