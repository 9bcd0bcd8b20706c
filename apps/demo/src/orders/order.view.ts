import type { Order, OrderStatus } from './order.entity.js';

/** What the API answers for an order (and what the idempotency guard replays). */
export interface OrderView {
  id: string;
  orderNo: string;
  amount: number;
  status: OrderStatus;
  userId: string;
  createdAt: Date;
  /** The first successful payment's transaction id; null until paid. */
  transactionId: string | null;
  /** When that payment happened; null until paid. */
  paidAt: Date | null;
}

export const toOrderView = (order: Order): OrderView => ({
  id: order.id,
  orderNo: order.orderNo,
  amount: order.amount,
  status: order.status,
  userId: order.userId,
  createdAt: order.createdAt,
  transactionId: order.transactionId ?? null,
  paidAt: order.paidAt ?? null,
});
