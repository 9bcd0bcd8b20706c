import { Column, Entity, Index, PrimaryColumn } from 'typeorm';
import type { UnreplayableReason } from '../../index.js';

/**
 * Table of `PostgresIdempotencyStore`, as `IdempotencyRecords1764460800000` creates it and
 * `IdempotencyResponseFlags1795996800002` extends it.
 */
export const IDEMPOTENCY_RECORDS_TABLE = 'idempotency_records';

/**
 * A row of `idempotency_records`, for tooling and for `synchronize` users; the store itself
 * speaks SQL. Matches the migration column for column, so `migration:generate` finds nothing.
 */
@Entity({ name: IDEMPOTENCY_RECORDS_TABLE })
@Index('idx_idempotency_records_expires_at', ['expiresAt'])
export class IdempotencyRecordEntity {
  /** The store key, or for one over 1,020 UTF-8 bytes its digest form (`recordKey`). */
  @PrimaryColumn({ type: 'varchar', length: 1024, primaryKeyConstraintName: 'pk_idempotency_records' })
  key!: string;

  @Column({ type: 'varchar', length: 16 })
  state!: 'processing' | 'completed';

  /** Owner token of the claim that holds (or completed) the key. */
  @Column({ type: 'varchar', length: 64 })
  token!: string;

  /** Request fingerprint ('' when not compared). */
  @Column({ type: 'varchar', length: 128 })
  fingerprint!: string;

  @Column({ name: 'status_code', type: 'integer', nullable: true })
  statusCode!: number | null;

  /** Allowlisted response headers. */
  @Column({ type: 'jsonb', nullable: true })
  headers!: Record<string, string> | null;

  /** The saved body: UTF-8 text, or base64 when `bodyEncoding` says so. */
  @Column({ type: 'text', nullable: true })
  body!: string | null;

  @Column({ name: 'has_body', type: 'boolean', default: false })
  hasBody!: boolean;

  /** `base64` when `body` holds base64 of the bytes; NULL for text (`SavedResponse.encoding`). */
  @Column({ name: 'body_encoding', type: 'varchar', length: 16, nullable: true })
  bodyEncoding!: 'base64' | null;

  /** Why a completed record holds no replayable answer, or NULL (`SavedResponse.unreplayable`). */
  @Column({ type: 'varchar', length: 32, nullable: true })
  unreplayable!: UnreplayableReason | null;

  /** End of the lease (processing) or of the retention (completed), by the database clock. */
  @Column({ name: 'expires_at', type: 'timestamptz' })
  expiresAt!: Date;
}
