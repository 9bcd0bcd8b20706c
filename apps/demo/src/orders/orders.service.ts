import { Injectable } from '@nestjs/common';
import { InjectRepository } from '@nestjs/typeorm';
import { QueryFailedError, type Repository } from 'typeorm';
import type { CreateOrderDto } from './create-order.dto.js';
import { Order, UQ_ORDERS_ORDER_NO } from './order.entity.js';
import { toOrderView, type OrderView } from './order.view.js';
import { orderExists, orderNotFound } from './orders.exceptions.js';

const isOrderNoTaken = (error: unknown): boolean => {
  if (!(error instanceof QueryFailedError)) return false;
  const driverError = error.driverError as { code?: string; constraint?: string } | undefined;
  return driverError?.code === '23505' && driverError.constraint === UQ_ORDERS_ORDER_NO;
};

@Injectable()
export class OrdersService {
  constructor(@InjectRepository(Order) private readonly orders: Repository<Order>) {}

  /**
   * One plain INSERT; the unique index decides between concurrent requests (no find-then-insert,
   * which lets two requests both pass the find).
   */
  async create(dto: CreateOrderDto, userId: string): Promise<OrderView> {
    const order = this.orders.create({ orderNo: dto.orderNo, amount: dto.amount, userId });
    try {
      const result = await this.orders.insert(order);
      Object.assign(order, result.generatedMaps[0]);
    } catch (error) {
      if (isOrderNoTaken(error)) throw orderExists();
      throw error;
    }
    return toOrderView(order);
  }

  async findByOrderNo(orderNo: string): Promise<OrderView> {
    const order = await this.orders.findOneBy({ orderNo });
    if (!order) throw orderNotFound();
    return toOrderView(order);
  }
}
