import { Logger, type OnApplicationShutdown, type OnModuleInit } from '@nestjs/common';
import { randomUUID } from 'node:crypto';
import type { DataSource, EntityManager } from 'typeorm';
import { IdempotencyStoreError } from '../../index.js';
import { uniqueViolationOf } from '../helpers/unique-violation.js';
import {
  answerFromFound,
  IDEMPOTENCY_OUTCOMES_TABLE,
  outcomeOf,
  type FoundRecord,
  type HeldOutcome,
  type OutcomeClaim,
  type OutcomeClaimInput,
  type OutcomeState,
  type RecordedOutcome,
} from './outcome-claim.js';
import { claimSql, finishSql, getSql, lockSql, renewSql } from './postgres-outcome-recorder.sql.js';
import { coverNewConnections } from '../postgres/new-connections.js';
import { pinRepositories, refuseRoutedRepositories } from '../helpers/routed-repositories.js';
import { ExpiredRowsPurge, keptClaimsMs } from '../postgres/purge.js';
import {
  claimUntilAnswered,
  MAX_RETENTION_MS,
  mustRunAgain,
  postgresSchemaOf,
  positiveMs,
  purgeIntervalMs,
  sqlStateOf,
  statementRunner,
  tryingAgain,
  type RunStatement,
} from '../postgres/statements.js';
import { entityTable, qualifiedTable } from '../postgres/table-name.js';

export interface PostgresOutcomeRecorderOptions {
  /** Table, `name` or `schema.name`. Default `idempotency_outcomes` in the DataSource's `schema`. */
  tableName?: string;
  /** Lease of a claim, milliseconds, unless the claim sets its own. Default 30,000. */
  leaseMs?: number;
  /** How long SUCCESS and FAILED records are kept (and repeats recognised), milliseconds. Default 7 days. */
  retentionMs?: number;
  /**
   * Deletes expired records every this many milliseconds, from `onModuleInit` until
   * `onApplicationShutdown` (an unref'd timer). Default: never; call `purgeExpired()` yourself.
   */
  purgeIntervalMs?: number;
  /** Rows one purge statement deletes at most. Default 1000. */
  purgeBatchSize?: number;
  /**
   * How long the purge keeps a PROCESSING record past the end of its lease, milliseconds: until
   * then a late owner nobody took over may still record (`succeed`, `succeedWith`), and a repeat
   * finds the record. Default 600,000 (as the PostgreSQL store), at most a year.
   */
  keepExpiredClaimsMs?: number;
}

/** A live record, as `get` reads it. */
export interface OutcomeRecordView {
  recordId: string;
  requestId: string | null;
  contentHash: string;
  state: OutcomeState;
  attempt: number;
  outcome?: RecordedOutcome;
  /** Milliseconds until the lease (PROCESSING) or the retention (SUCCESS, FAILED) ends. */
  ttlMs: number;
}

type ClaimRow = FoundRecord & { kind: 'acquired' | 'found'; attempt: number | null; previous_state: OutcomeState | null };

const DEFAULT_LEASE_MS = 30_000;
const DEFAULT_RETENTION_MS = 7 * 24 * 60 * 60 * 1000;
/** PostgreSQL `deadlock_detected`: two claims took the same rows' locks in another order. */
const DEADLOCK = '40P01';

/**
 * Durable outcomes of operations known by a request id AND by a content hash (two layers: the
 * request id first, then the content), on PostgreSQL. A record is PROCESSING (with a lease),
 * SUCCESS (its answer is replayed) or FAILED (the operation may run again), until its retention
 * ends. Each operation is one statement, timed by the database clock; every write is fenced by
 * the claim's owner token, so a late owner whose record was taken over writes nothing.
 * Create the table with `IDEMPOTENCY_OUTCOME_MIGRATIONS`.
 */
export class PostgresOutcomeRecorder implements OnModuleInit, OnApplicationShutdown {
  private readonly logger = new Logger(PostgresOutcomeRecorder.name);
  private readonly sql: Record<'claim' | 'finish' | 'renew' | 'lock' | 'get', string>;
  private readonly run: RunStatement;
  private readonly leaseMs: number;
  private readonly retentionMs: number;
  private readonly purgeSchedule: ExpiredRowsPurge;

  constructor(
    readonly dataSource: DataSource,
    options: PostgresOutcomeRecorderOptions = {},
  ) {
    const schema = postgresSchemaOf('PostgresOutcomeRecorder', dataSource);
    this.leaseMs = positiveMs('PostgresOutcomeRecorder', 'leaseMs', options.leaseMs ?? DEFAULT_LEASE_MS);
    this.retentionMs = positiveMs('PostgresOutcomeRecorder', 'retentionMs', options.retentionMs ?? DEFAULT_RETENTION_MS, MAX_RETENTION_MS);
    this.run = statementRunner(dataSource);
    const table = qualifiedTable(options.tableName ?? entityTable(dataSource.options, IDEMPOTENCY_OUTCOMES_TABLE), schema);
    this.sql = {
      claim: claimSql(table),
      finish: finishSql(table),
      renew: renewSql(table),
      lock: lockSql(table),
      get: getSql(table),
    };
    this.purgeSchedule = new ExpiredRowsPurge({
      run: this.run,
      table,
      idColumn: 'id',
      batchSize: options.purgeBatchSize,
      intervalMs: purgeIntervalMs('PostgresOutcomeRecorder', options.purgeIntervalMs),
      logger: this.logger,
      keepExpiredClaimsMs: keptClaimsMs('PostgresOutcomeRecorder', options.keepExpiredClaimsMs),
      claimState: 'PROCESSING',
      what: 'outcome records',
    });
  }

  /**
   * Claims an operation: a new record, or the take-over of a FAILED or expired one (`acquired`);
   * otherwise what holds it (`success` with the recorded answer, `processing`, `mismatch`).
   * One statement; it runs again in the rare case its snapshot missed a concurrent claim.
   */
  claim(input: OutcomeClaimInput): Promise<OutcomeClaim> {
    let leaseMs: number;
    try {
      refuseClaimInput(input);
      leaseMs = positiveMs('PostgresOutcomeRecorder', 'leaseMs', input.leaseMs ?? this.leaseMs);
    } catch (error) {
      return Promise.reject(error as Error);
    }
    const token = randomUUID();
    const params = [input.scope, input.requestId ?? null, input.contentHash, token, leaseMs];
    return claimUntilAnswered<OutcomeClaim>(`outcome claim in ${JSON.stringify(input.scope)}`, async () => {
      let rows: ClaimRow[];
      try {
        rows = (await this.run(this.sql.claim, params)).records as ClaimRow[];
      } catch (error) {
        // A key taken by a concurrent claim after this statement's snapshot, or a lock-order
        // deadlock between two claims: both resolve on a fresh statement.
        const cause = (error as Error).cause;
        if (uniqueViolationOf(cause) || sqlStateOf(cause) === DEADLOCK) return undefined;
        throw error;
      }
      const acquired = rows.find((row) => row.kind === 'acquired');
      if (acquired) {
        const held = { recordId: String(acquired.id), token, attempt: acquired.attempt ?? 1 };
        return acquired.previous_state ? { status: 'acquired', held, previousState: acquired.previous_state } : { status: 'acquired', held };
      }
      return answerFromFound(rows.map(normalized), input);
    });
  }

  /** Records SUCCESS and its answer if `held` still holds the record; false when refused. */
  succeed(held: HeldOutcome, outcome: RecordedOutcome): Promise<boolean> {
    return this.finish(held, 'SUCCESS', outcome);
  }

  /**
   * Records FAILED (the operation may run again: the next claim takes the record over) with the
   * answer given this time, if `held` still holds the record; false when refused.
   */
  fail(held: HeldOutcome, outcome: RecordedOutcome): Promise<boolean> {
    return this.finish(held, 'FAILED', outcome);
  }

  /**
   * Extends the lease of the PROCESSING claim `held` holds so that it ends `leaseMs` from now (by
   * the database clock; default: the recorder's `leaseMs`), in one fenced statement. Call it
   * before the lease runs out while the work goes on, so that no other claim takes the record
   * over. False when `held` no longer holds a live PROCESSING claim (it was recorded, taken over,
   * or its lease ran out, even if nobody claimed it again): the caller has lost the lease and
   * should stop. (`succeed` and `fail` still accept a late owner that nobody took over.)
   */
  async renew(held: HeldOutcome, leaseMs: number = this.leaseMs): Promise<boolean> {
    const params = [held.recordId, held.token, positiveMs('PostgresOutcomeRecorder', 'leaseMs', leaseMs)];
    return (await this.run(this.sql.renew, params)).affected === 1;
  }

  /**
   * Runs `work` and records SUCCESS with the answer it returns, in ONE transaction that first
   * locks the record, and only if `held` still holds it. So the work's writes (through the
   * `EntityManager` given to it) and the record commit together; a late owner whose record was
   * taken over runs nothing and gets `{ recorded: false }`. If `work` throws, everything rolls
   * back and the error is rethrown (the record stays PROCESSING: `fail` it).
   * Keep `work` short: claims of the same record wait for the transaction.
   *
   * The transaction runs at the database's default isolation. Under REPEATABLE READ or
   * SERIALIZABLE the lock fails with 40001 when the record changed while it waited (a renewal of
   * it): the transaction then runs again, since `work` has not run; a 40001 from `work` or the
   * commit is thrown (your work may have done more than its writes).
   */
  async succeedWith(
    held: HeldOutcome,
    work: (manager: EntityManager) => Promise<RecordedOutcome>,
  ): Promise<{ recorded: true; outcome: RecordedOutcome } | { recorded: false }> {
    refuseRoutedRepositories(this.dataSource, 'succeedWith', 'its SUCCESS');
    coverNewConnections(this.dataSource);
    let working = false;
    const inTransaction = () =>
      this.dataSource.transaction(async (manager): Promise<{ recorded: true; outcome: RecordedOutcome } | { recorded: false }> => {
        const runner = manager.queryRunner!;
        const locked = await this.run(this.sql.lock, [held.recordId, held.token], runner);
        if (locked.records.length === 0) return { recorded: false };
        working = true;
        const outcome = await work(pinRepositories(manager));
        const finished = await this.run(this.sql.finish, this.finishParams(held, 'SUCCESS', outcome), runner);
        if (finished.affected !== 1) throw new IdempotencyStoreError(`Outcome record ${held.recordId} changed while locked`);
        return { recorded: true, outcome };
      });
    // Only the lock, refused before `work` ran, runs again.
    return tryingAgain(inTransaction, (error) => !working && mustRunAgain((error as Error).cause));
  }

  /** The live record of a request id, or else of a content hash, in `scope`. */
  async get(scope: string, key: { requestId: string } | { contentHash: string }): Promise<OutcomeRecordView | undefined> {
    const params = 'requestId' in key ? [scope, key.requestId, null] : [scope, null, key.contentHash];
    const [row] = (await this.run(this.sql.get, params)).records as (FoundRecord & { attempt: number; ttl_ms: number })[];
    if (!row) return undefined;
    const view: OutcomeRecordView = {
      recordId: String(row.id),
      requestId: row.request_id,
      contentHash: row.content_hash,
      state: row.state,
      attempt: row.attempt,
      ttlMs: row.ttl_ms,
    };
    if (row.state !== 'PROCESSING') view.outcome = outcomeOf(row);
    return view;
  }

  /** Deletes expired records (retention over, or an abandoned lease) in batches; returns how many. */
  purgeExpired(): Promise<number> {
    return this.purgeSchedule.purgeExpired();
  }

  onModuleInit(): void {
    this.purgeSchedule.start();
  }

  async onApplicationShutdown(): Promise<void> {
    // The DataSource closes after its module shuts down; let a running purge finish first.
    await this.purgeSchedule.stop();
  }

  private async finish(held: HeldOutcome, state: 'SUCCESS' | 'FAILED', outcome: RecordedOutcome): Promise<boolean> {
    return (await this.run(this.sql.finish, this.finishParams(held, state, outcome))).affected === 1;
  }

  private finishParams(held: HeldOutcome, state: 'SUCCESS' | 'FAILED', outcome: RecordedOutcome): unknown[] {
    const { statusCode } = outcome;
    if (!Number.isInteger(statusCode) || statusCode < 100 || statusCode > 999) {
      throw new RangeError(`PostgresOutcomeRecorder: statusCode must be an integer from 100 to 999, got ${shownInput(statusCode)}`);
    }
    const body = outcome.body === undefined ? null : JSON.stringify(outcome.body);
    return [held.recordId, held.token, state, outcome.statusCode, body ?? null, this.retentionMs];
  }
}


/** pg returns bigint ids as text; keep them so, and the lease as a number. */
function normalized(row: ClaimRow): FoundRecord {
  return { ...row, id: String(row.id), remaining_ms: Number(row.remaining_ms ?? 0) };
}

/** A refused input as its message shows it: a string quoted, anything else as `String` writes it (JSON has no BigInt). */
const shownInput = (value: unknown) => (typeof value === 'string' ? JSON.stringify(value) : String(value));

/** The content hash as `@ContentHash()` gives it: SHA-256, 64 lower-case hex digits. */
const CONTENT_HASH = /^[0-9a-f]{64}$/;

/**
 * Refuses a claim the table cannot hold as given, before any statement (`RangeError`): failing
 * in the database, it was an `IdempotencyStoreError` an app answers as an outage; a hash in
 * capitals made the same bytes two records; an empty request id was kept as one (an adversarial
 * helper). The columns hold 255 characters of scope and request id, without NUL; a lone
 * surrogate would be sent as U+FFFD, two ids one.
 */
function refuseClaimInput({ scope, requestId, contentHash }: OutcomeClaimInput): void {
  const text = (name: string, value: unknown) => {
    if (typeof value !== 'string' || value === '' || (value.length > 255 && [...value].length > 255) || value.includes('\0') || /\p{Cs}/u.test(value)) {
      throw new RangeError(`PostgresOutcomeRecorder.claim: ${name} must be text of 1 to 255 characters, without NUL or a lone surrogate, got ${shownInput(value)}`);
    }
  };
  text('scope', scope);
  if (requestId !== undefined && requestId !== null) text('requestId', requestId);
  if (typeof contentHash !== 'string' || !CONTENT_HASH.test(contentHash)) {
    throw new RangeError(`PostgresOutcomeRecorder.claim: contentHash must be a SHA-256 as 64 lower-case hex digits (as @ContentHash() gives it), got ${shownInput(contentHash)}`);
  }
}
