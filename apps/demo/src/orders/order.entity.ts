import { Column, Entity, Index, PrimaryGeneratedColumn, type ValueTransformer } from 'typeorm';

/** Name of the unique index on `orders.order_no`; a violation of it means "order exists". */
export const UQ_ORDERS_ORDER_NO = 'uq_orders_order_no';

export type OrderStatus = 'PENDING' | 'PAID' | 'CANCELLED';

/** `numeric` comes back from pg as a string (exact decimal); the demo's amounts fit a double. */
export const numericToNumber: ValueTransformer = {
  to: (value: number | null | undefined) => value,
  from: (value: string | null) => (value === null ? null : Number(value)),
};

/** The table is created by the migrations in `../migrations` (no `synchronize`): keep both in step. */
@Entity({ name: 'orders' })
@Index(UQ_ORDERS_ORDER_NO, ['orderNo'], { unique: true })
export class Order {
  @PrimaryGeneratedColumn('uuid', { primaryKeyConstraintName: 'pk_orders' })
  id!: string;

  @Column({ name: 'order_no', type: 'varchar', length: 64 })
  orderNo!: string;

  @Column({ name: 'user_id', type: 'varchar', length: 64 })
  userId!: string;

  @Column({ type: 'numeric', precision: 12, scale: 2, transformer: numericToNumber })
  amount!: number;

  @Column({ type: 'varchar', length: 16, default: 'PENDING' })
  status!: OrderStatus;

  @Column({ name: 'created_at', type: 'timestamptz', default: () => 'now()' })
  createdAt!: Date;

  /** The payment provider's transaction id: set once, by the first successful payment. */
  @Column({ name: 'transaction_id', type: 'varchar', length: 128, nullable: true })
  transactionId!: string | null;

  /** When the provider says the payment happened: set once, with `transactionId`. */
  @Column({ name: 'paid_at', type: 'timestamptz', nullable: true })
  paidAt!: Date | null;

  /** Bumped by every conditional status update; a plain column, not TypeORM's @VersionColumn. */
  @Column({ type: 'integer', default: 1 })
  version!: number;
}
