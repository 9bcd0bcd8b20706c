import { Column, Entity, Index, PrimaryGeneratedColumn, Unique } from 'typeorm';
import { IDEMPOTENCY_OUTCOMES_TABLE, type OutcomeState } from './outcome-claim.js';

/**
 * A row of `idempotency_outcomes`: one operation, known by its request id and by the SHA-256 of
 * its content, each unique within a scope. For tooling and `synchronize` users; the recorder
 * itself speaks SQL. Matches the migration column for column.
 */
@Entity({ name: IDEMPOTENCY_OUTCOMES_TABLE })
@Unique('uq_idempotency_outcomes_request', ['scope', 'requestId'])
@Unique('uq_idempotency_outcomes_content', ['scope', 'contentHash'])
@Index('idx_idempotency_outcomes_expires_at', ['expiresAt'])
export class OutcomeRecordEntity {
  /** bigint: the pg driver returns it as a string. */
  @PrimaryGeneratedColumn('increment', { type: 'bigint', primaryKeyConstraintName: 'pk_idempotency_outcomes' })
  id!: string;

  /** Namespace of the two unique keys: the endpoint, and the tenant or user whose records these are. */
  @Column({ type: 'varchar', length: 255 })
  scope!: string;

  /** The client's request id; NULL when it sent none (then only the content hash identifies it). */
  @Column({ name: 'request_id', type: 'varchar', length: 255, nullable: true })
  requestId!: string | null;

  /** Lower-case hex SHA-256 of the raw content. */
  @Column({ name: 'content_hash', type: 'varchar', length: 64 })
  contentHash!: string;

  @Column({ type: 'varchar', length: 16 })
  state!: OutcomeState;

  /** Owner token of the claim that holds (or recorded) the row: the fence of every write. */
  @Column({ type: 'varchar', length: 64 })
  token!: string;

  /** 1 for the first claim, +1 for each take-over (a retry after FAILED, an expired lease). */
  @Column({ type: 'integer', default: 1 })
  attempt!: number;

  /** Status code of the recorded answer (SUCCESS, FAILED). */
  @Column({ name: 'status_code', type: 'integer', nullable: true })
  statusCode!: number | null;

  /** The recorded answer's body as JSON text; NULL for none. */
  @Column({ type: 'text', nullable: true })
  body!: string | null;

  @Column({ name: 'created_at', type: 'timestamptz', default: () => 'now()' })
  createdAt!: Date;

  @Column({ name: 'updated_at', type: 'timestamptz', default: () => 'now()' })
  updatedAt!: Date;

  /** PROCESSING: end of the lease. SUCCESS, FAILED: end of the retention. By the database clock. */
  @Column({ name: 'expires_at', type: 'timestamptz' })
  expiresAt!: Date;
}

/** The outcome recorder's entity, for the DataSource's `entities` (tooling; the recorder needs none). */
export const IDEMPOTENCY_OUTCOME_ENTITIES = [OutcomeRecordEntity];
