import { Column, Entity, Index, PrimaryGeneratedColumn } from 'typeorm';
import { numericToNumber } from '../orders/order.entity.js';

/**
 * A payment of an order, as `POST /payments` records it: one row per operation, written in the
 * same transaction as its idempotency record (`IdempotentTransactions`), so a retry never adds a
 * second one. No unique index holds it: the transaction does. Created by `DemoPayments1796169600000`.
 */
@Entity({ name: 'payments' })
@Index('idx_payments_order_no', ['orderNo'])
export class Payment {
  @PrimaryGeneratedColumn('uuid', { primaryKeyConstraintName: 'pk_payments' })
  id!: string;

  @Column({ name: 'order_no', type: 'varchar', length: 64 })
  orderNo!: string;

  @Column({ type: 'numeric', precision: 12, scale: 2, transformer: numericToNumber })
  amount!: number;

  @Column({ name: 'user_id', type: 'varchar', length: 64 })
  userId!: string;

  @Column({ name: 'created_at', type: 'timestamptz', default: () => 'now()' })
  createdAt!: Date;
}
