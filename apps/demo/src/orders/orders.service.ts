import { Injectable } from '@nestjs/common';
import { InjectRepository } from '@nestjs/typeorm';
import type { Repository } from 'typeorm';
import { insertOnce } from 'nestjs-idempotency/typeorm';
import type { CreateOrderDto } from './create-order.dto.js';
import { Order } from './order.entity.js';
import { markCancelled, markPaid, type Payment } from './order-transitions.js';
import { toOrderView, type OrderView } from './order.view.js';
import { orderExists, orderNotCancellable, orderNotFound, orderNotPayable } from './orders.exceptions.js';

/** The answer of an idempotent state change: whether this call changed the order, and the order. */
export interface OrderChange {
  changed: boolean;
  order: OrderView;
}

type TransitionResult = Awaited<ReturnType<typeof markPaid>>;

@Injectable()
export class OrdersService {
  constructor(@InjectRepository(Order) private readonly orders: Repository<Order>) {}

  /**
   * One plain INSERT; the unique index on orderNo decides between concurrent requests (no
   * find-then-insert, which lets two requests both pass the find). This is the layer behind the
   * idempotency guard: a retry that gets past it (store down with fail-open, record expired)
   * finds the order its first attempt created and gets it back (`created: false`). The same
   * orderNo from another user, or with another amount, is 409 `ORDER_EXISTS`.
   */
  async create(dto: CreateOrderDto, userId: string): Promise<{ created: boolean; order: OrderView }> {
    const { orderNo, amount } = dto;
    const result = await insertOnce(this.orders, { orderNo, amount, userId }, () => ({ orderNo }));
    const order = result.entity;
    if (!result.created && (order.userId !== userId || order.amount !== amount)) throw orderExists();
    return { created: result.created, order: toOrderView(order) };
  }

  async findByOrderNo(orderNo: string): Promise<OrderView> {
    const order = await this.orders.findOneBy({ orderNo });
    if (!order) throw orderNotFound();
    return toOrderView(order);
  }

  /**
   * PENDING → PAID. A repeated callback (with any transaction id) changes nothing and answers
   * the order as the first payment left it. 404 `ORDER_NOT_FOUND`, 409 `ORDER_NOT_PAYABLE`.
   */
  async pay(orderNo: string, payment: Payment): Promise<OrderChange> {
    return this.answer(orderNo, await markPaid(this.orders, orderNo, payment), orderNotPayable);
  }

  /** PENDING → CANCELLED; repeated, changes nothing. 404 `ORDER_NOT_FOUND`, 409 `ORDER_NOT_CANCELLABLE`. */
  async cancel(orderNo: string): Promise<OrderChange> {
    return this.answer(orderNo, await markCancelled(this.orders, orderNo), orderNotCancellable);
  }

  private async answer(orderNo: string, result: TransitionResult, notAllowed: (status: string) => Error): Promise<OrderChange> {
    if (result.changed) return { changed: true, order: toOrderView(result.entity) };
    const order = result.entity ?? (await this.orders.findOneBy({ orderNo }));
    if (result.reason === 'not_found' || !order) throw orderNotFound();
    if (result.reason === 'already_done') return { changed: false, order: toOrderView(order) };
    // 'not_allowed' (and 'version_conflict', which needs an expectedVersion this demo never sets).
    throw notAllowed(order.status);
  }
}
