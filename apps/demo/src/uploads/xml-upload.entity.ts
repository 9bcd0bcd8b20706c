import { Column, Entity, PrimaryGeneratedColumn } from 'typeorm';
import { numericToNumber } from '../orders/order.entity.js';

/**
 * One stored XML upload (a receipt). No unique business key on purpose: the raw bytes are the
 * contract, so a receipt sent again with other whitespace is another upload; repeats of the same
 * bytes are recognised by the outcome records (`idempotency_outcomes`), written in the same
 * transaction. The table is created by the migrations in `../migrations`: keep both in step.
 */
@Entity({ name: 'xml_uploads' })
export class XmlUpload {
  /** The upload id. */
  @PrimaryGeneratedColumn('uuid', { primaryKeyConstraintName: 'pk_xml_uploads' })
  id!: string;

  /** `X-User-Id` of the uploader; NULL for an anonymous upload. */
  @Column({ name: 'user_id', type: 'varchar', length: 64, nullable: true })
  userId!: string | null;

  /** The request id the upload was processed under; NULL when the client sent none. */
  @Column({ name: 'request_id', type: 'varchar', length: 255, nullable: true })
  requestId!: string | null;

  /** Lower-case hex SHA-256 of the raw bytes. */
  @Column({ name: 'content_hash', type: 'varchar', length: 64 })
  contentHash!: string;

  @Column({ name: 'receipt_no', type: 'varchar', length: 64 })
  receiptNo!: string;

  @Column({ type: 'numeric', precision: 12, scale: 2, transformer: numericToNumber })
  amount!: number;

  @Column({ name: 'created_at', type: 'timestamptz', default: () => 'now()' })
  createdAt!: Date;
}
