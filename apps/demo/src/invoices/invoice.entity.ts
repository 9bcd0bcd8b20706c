import { Column, Entity, Index, PrimaryGeneratedColumn } from 'typeorm';
import { numericToNumber } from '../orders/order.entity.js';

/** One invoice per idempotency token. */
export const UQ_INVOICES_TOKEN = 'uq_invoices_token';
/** One invoice per (terminal, number). */
export const UQ_INVOICES_TERMINAL_NUMBER = 'uq_invoices_terminal_number';

/** The table is created by the migrations in `../migrations` (no `synchronize`): keep both in step. */
@Entity({ name: 'invoices' })
@Index(UQ_INVOICES_TOKEN, ['idempotencyToken'], { unique: true })
@Index(UQ_INVOICES_TERMINAL_NUMBER, ['terminalId', 'number'], { unique: true })
export class Invoice {
  @PrimaryGeneratedColumn('uuid', { primaryKeyConstraintName: 'pk_invoices' })
  id!: string;

  /** The client's `X-Idempotency-Token` (a UUID, stored lower-case by PostgreSQL). */
  @Column({ name: 'idempotency_token', type: 'uuid' })
  idempotencyToken!: string;

  @Column({ name: 'terminal_id', type: 'varchar', length: 64 })
  terminalId!: string;

  @Column({ type: 'varchar', length: 64 })
  number!: string;

  @Column({ type: 'numeric', precision: 12, scale: 2, transformer: numericToNumber })
  amount!: number;

  @Column({ name: 'created_at', type: 'timestamptz', default: () => 'now()' })
  createdAt!: Date;
}
