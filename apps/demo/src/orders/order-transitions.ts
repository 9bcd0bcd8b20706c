import type { Repository } from 'typeorm';
import { transition } from 'nestjs-idempotency/typeorm';
import type { Order } from './order.entity.js';

/** What a payment provider reports, by HTTP callback or by a `payment.succeeded` message. */
export interface Payment {
  transactionId: string;
  paidAt: Date;
}

/**
 * PENDING → PAID with the payment's transaction id and time, in one conditional UPDATE: of
 * concurrent or repeated payments exactly one changes the order, so the first transaction id
 * and time stay. Pass a transaction's repository to make it part of that transaction.
 */
export const markPaid = (orders: Repository<Order>, orderNo: string, payment: Payment) =>
  transition(orders, {
    where: { orderNo },
    from: ['PENDING'],
    to: 'PAID',
    set: { transactionId: payment.transactionId, paidAt: payment.paidAt },
  });

/** PENDING → CANCELLED, in one conditional UPDATE. */
export const markCancelled = (orders: Repository<Order>, orderNo: string) =>
  transition(orders, { where: { orderNo }, from: ['PENDING'], to: 'CANCELLED' });
