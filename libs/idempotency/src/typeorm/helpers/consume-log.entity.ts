import { Column, Entity, PrimaryColumn } from 'typeorm';

/** Table of `consumeOnce`, as `IdempotencyConsumeLog1764460800001` creates it. */
export const IDEMPOTENCY_CONSUME_LOG_TABLE = 'idempotency_consume_log';

/**
 * One message a consumer has processed: its primary key (consumer, message id) is what makes a
 * redelivery a duplicate. Written in the same transaction as the consumer's own changes.
 */
@Entity({ name: IDEMPOTENCY_CONSUME_LOG_TABLE })
export class ConsumeLogEntry {
  /** Who processed the message (a queue and handler name): consumers of one message are independent. */
  @PrimaryColumn({ type: 'varchar', length: 128, primaryKeyConstraintName: 'pk_idempotency_consume_log' })
  consumer!: string;

  /** The message's id as the producer or broker set it. */
  @PrimaryColumn({
    name: 'message_id',
    type: 'varchar',
    length: 255,
    primaryKeyConstraintName: 'pk_idempotency_consume_log',
  })
  messageId!: string;

  @Column({ name: 'consumed_at', type: 'timestamptz', default: () => 'now()' })
  consumedAt!: Date;
}
