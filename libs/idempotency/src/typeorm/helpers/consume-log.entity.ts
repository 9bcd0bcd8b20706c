import { Column, Entity, PrimaryColumn } from 'typeorm';

/** Table of `consumeOnce`, as `IdempotencyConsumeLog1764460800001` creates it. */
export const IDEMPOTENCY_CONSUME_LOG_TABLE = 'idempotency_consume_log';
/** Width of the `consumer` column (`varchar(128)`), in characters. */
export const CONSUMER_COLUMN_CHARS = 128;
/** Width of the `message_id` column (`varchar(255)`), in characters. */
export const MESSAGE_ID_COLUMN_CHARS = 255;

/**
 * One message a consumer has processed: its primary key (consumer, message id) is what makes a
 * redelivery a duplicate. Written in the same transaction as the consumer's own changes.
 */
@Entity({ name: IDEMPOTENCY_CONSUME_LOG_TABLE })
export class ConsumeLogEntry {
  /** Who processed the message (a queue and handler name): consumers of one message are independent. */
  @PrimaryColumn({ type: 'varchar', length: CONSUMER_COLUMN_CHARS, primaryKeyConstraintName: 'pk_idempotency_consume_log' })
  consumer!: string;

  /**
   * The message's id as the producer or broker set it, when it fits (at most 255 characters, no
   * NUL); otherwise its digest form (a head, `#sha256:` and the SHA-256 of the whole id).
   */
  @PrimaryColumn({
    name: 'message_id',
    type: 'varchar',
    length: MESSAGE_ID_COLUMN_CHARS,
    primaryKeyConstraintName: 'pk_idempotency_consume_log',
  })
  messageId!: string;

  @Column({ name: 'consumed_at', type: 'timestamptz', default: () => 'now()' })
  consumedAt!: Date;
}
