import { Injectable } from '@nestjs/common';
import { InjectRepository } from '@nestjs/typeorm';
import { sha256Hex } from 'nestjs-idempotency';
import { IdempotentTransactions, type IdempotentRunResult } from 'nestjs-idempotency/typeorm';
import type { Repository } from 'typeorm';
import { Order } from '../orders/order.entity.js';
import { orderNotFound } from '../orders/orders.exceptions.js';
import type { CreatePaymentDto } from './create-payment.dto.js';
import { Payment } from './payment.entity.js';

/** A payment as the API shows it. */
export interface PaymentView {
  id: string;
  orderNo: string;
  amount: number;
  userId: string;
  createdAt: string;
}

const viewOf = (payment: Payment): PaymentView => ({
  id: payment.id,
  orderNo: payment.orderNo,
  amount: payment.amount,
  userId: payment.userId,
  createdAt: payment.createdAt.toISOString(),
});

@Injectable()
export class PaymentsService {
  constructor(
    private readonly transactions: IdempotentTransactions,
    @InjectRepository(Payment) private readonly payments: Repository<Payment>,
  ) {}

  /**
   * Records a payment once per (user, client key): the payment row, the idempotency record and
   * the answer commit in one transaction, so a crash leaves both or neither, and a retry replays
   * the same payment. The fingerprint is the body's: the same key with another body is refused.
   */
  pay(userId: string, clientKey: string, dto: CreatePaymentDto): Promise<IdempotentRunResult<PaymentView>> {
    const fingerprint = sha256Hex(Buffer.from(JSON.stringify({ orderNo: dto.orderNo, amount: dto.amount })));
    return this.transactions.run({ key: `payments:${userId}:${clientKey}`, fingerprint }, async (manager) => {
      if (!(await manager.existsBy(Order, { orderNo: dto.orderNo }))) throw orderNotFound();
      const payment = await manager.save(manager.create(Payment, { orderNo: dto.orderNo, amount: dto.amount, userId }));
      const saved = await manager.findOneByOrFail(Payment, { id: payment.id });
      return { statusCode: 201, body: viewOf(saved) };
    });
  }

  /** The payments recorded for an order, oldest first. */
  async ofOrder(orderNo: string): Promise<PaymentView[]> {
    return (await this.payments.find({ where: { orderNo }, order: { createdAt: 'ASC', id: 'ASC' } })).map(viewOf);
  }
}
