import { Column, Entity, Index, PrimaryGeneratedColumn, type ValueTransformer } from 'typeorm';

/** Name of the unique index on `orders.order_no`; a violation of it means "order exists". */
export const UQ_ORDERS_ORDER_NO = 'uq_orders_order_no';

export type OrderStatus = 'PENDING' | 'PAID';

/** `numeric` comes back from pg as a string (exact decimal); the demo's amounts fit a double. */
const numericToNumber: ValueTransformer = {
  to: (value: number | null | undefined) => value,
  from: (value: string | null) => (value === null ? null : Number(value)),
};

@Entity({ name: 'orders' })
@Index(UQ_ORDERS_ORDER_NO, ['orderNo'], { unique: true })
export class Order {
  @PrimaryGeneratedColumn('uuid')
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

  /** Set by the payment callback (a later feature). */
  @Column({ name: 'transaction_id', type: 'varchar', length: 64, nullable: true })
  transactionId!: string | null;

  /** Set by the payment callback (a later feature). */
  @Column({ name: 'paid_at', type: 'timestamptz', nullable: true })
  paidAt!: Date | null;

  /** Bumped by conditional updates (a later feature); a plain column, not TypeORM's @VersionColumn. */
  @Column({ type: 'integer', default: 1 })
  version!: number;
}
