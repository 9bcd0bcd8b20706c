import { Logger, type OnApplicationShutdown, type OnModuleInit } from '@nestjs/common';
import type { DataSource, QueryResult, QueryRunner } from 'typeorm';
import {
  IdempotencyConfigError,
  IdempotencyStore,
  IdempotencyStoreError,
  type ClaimInput,
  type ClaimResult,
  type SavedResponse,
  type StoredRecord,
  type UnreplayableReason,
} from '../../index.js';
import { IDEMPOTENCY_RECORDS_TABLE } from './idempotency-record.entity.js';
import { claimSql, completeSql, getSql, purgeSql, releaseSql } from './postgres-idempotency.sql.js';
import { recordKey } from './record-key.js';
import { PurgeSchedule, purgeInBatches } from '../postgres/purge-schedule.js';

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
}

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

/** How often a claim runs again when its snapshot missed a concurrent commit (see `claimSql`). */
const CLAIM_ATTEMPTS = 5;

/**
 * PostgreSQL store on a logged table: survives restarts and needs no Redis. Each operation is one
 * SQL statement (one round trip) on the DataSource's pool, each time taken from the database
 * clock, so application servers with skewed clocks agree. Create the table with
 * `IDEMPOTENCY_MIGRATIONS`. Keys of any length work: one over 1,020 UTF-8 bytes is stored as a
 * readable head and its SHA-256 (`recordKey`).
 */
export class PostgresIdempotencyStore extends IdempotencyStore implements OnModuleInit, OnApplicationShutdown {
  private readonly logger = new Logger(PostgresIdempotencyStore.name);
  private readonly sql: Record<'claim' | 'complete' | 'release' | 'get' | 'purge', string>;
  private readonly purgeSchedule = new PurgeSchedule(() => this.purgeExpired(), this.logger, 'idempotency records');

  constructor(
    readonly dataSource: DataSource,
    private readonly options: PostgresIdempotencyStoreOptions = {},
  ) {
    super();
    if (dataSource.options.type !== 'postgres') {
      throw new IdempotencyConfigError(`PostgresIdempotencyStore needs a postgres DataSource, not ${dataSource.options.type}`);
    }
    const table = qualifiedTable(options.tableName ?? IDEMPOTENCY_RECORDS_TABLE, dataSource.options.schema);
    this.sql = {
      claim: claimSql(table),
      complete: completeSql(table),
      release: releaseSql(table),
      get: getSql(table),
      purge: purgeSql(table),
    };
  }

  async claim({ key, token, fingerprint, leaseMs }: ClaimInput): Promise<ClaimResult> {
    for (let attempt = 1; attempt <= CLAIM_ATTEMPTS; attempt++) {
      const [row] = (await this.run(this.sql.claim, [recordKey(key), token, fingerprint, leaseMs])).records as ClaimRow[];
      if (!row) continue;
      if (row.acquired) return { status: 'acquired', token };
      if (fingerprint !== '' && row.fingerprint !== '' && row.fingerprint !== fingerprint) return { status: 'mismatch' };
      if (row.state === 'completed') return { status: 'completed', response: toSaved(row) };
      return { status: 'in_progress', retryAfterMs: Math.max(row.remaining_ms ?? 0, 0) };
    }
    throw new IdempotencyStoreError(`PostgreSQL claim of ${JSON.stringify(key)} found no answer in ${CLAIM_ATTEMPTS} attempts`);
  }

  async complete(key: string, token: string, response: SavedResponse, ttlMs: number): Promise<boolean> {
    const { statusCode, headers, body, encoding, unreplayable } = response;
    const hasBody = body !== undefined;
    const params = [
      recordKey(key),
      token,
      statusCode,
      JSON.stringify(headers),
      hasBody ? body : null,
      hasBody,
      ttlMs,
      encoding ?? null,
      unreplayable ?? null,
    ];
    return (await this.run(this.sql.complete, params)).affected === 1;
  }

  async release(key: string, token: string): Promise<boolean> {
    return (await this.run(this.sql.release, [recordKey(key), token])).affected === 1;
  }

  async get(key: string): Promise<StoredRecord | undefined> {
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

  /** Deletes expired records, in batches of `purgeBatchSize`; returns how many. */
  async purgeExpired(): Promise<number> {
    const deleteBatch = async (size: number) => (await this.run(this.sql.purge, [size])).affected ?? 0;
    return purgeInBatches(deleteBatch, this.options.purgeBatchSize ?? 1000);
  }

  onModuleInit(): void {
    this.purgeSchedule.start(this.options.purgeIntervalMs);
  }

  async onApplicationShutdown(): Promise<void> {
    // The DataSource closes after its module shuts down; let a running purge finish first.
    await this.purgeSchedule.stop();
  }

  /** Runs one statement on a pooled connection; database errors become `IdempotencyStoreError`. */
  private async run(sql: string, params: unknown[]): Promise<QueryResult> {
    let runner: QueryRunner | undefined;
    try {
      runner = this.dataSource.createQueryRunner();
      return await runner.query(sql, params, true);
    } catch (error) {
      throw new IdempotencyStoreError(`PostgreSQL query failed: ${(error as Error).message}`, { cause: error });
    } finally {
      await runner?.release();
    }
  }
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

function qualifiedTable(name: string, schema: string | undefined): string {
  const dot = name.indexOf('.');
  const [owner, table] = dot > 0 ? [name.slice(0, dot), name.slice(dot + 1)] : [schema, name];
  return owner ? `${quoteIdent(owner)}.${quoteIdent(table)}` : quoteIdent(table);
}

function quoteIdent(identifier: string): string {
  return `"${identifier.replace(/"/g, '""')}"`;
}
