import { Controller } from '@nestjs/common';
import { MessagePattern, Payload } from '@nestjs/microservices';
import { NoRepeatSubmit } from 'nestjs-idempotency';
import { CreateOrderMessage } from './create-order.message.js';
import type { OrderView } from './order.view.js';
import { OrdersService } from './orders.service.js';

/**
 * Order creation for other services, over the Redis transport (on when the demo runs with
 * `REDIS_URL`). A repeated message (a client's retry, a redelivery) gets the first answer; one
 * that arrives while the first is still running waits for it (`waitForResultMs`) instead of
 * failing, so the caller always gets the order.
 */
@Controller()
export class OrdersRpcController {
  constructor(private readonly orders: OrdersService) {}

  @MessagePattern('orders.create')
  @NoRepeatSubmit({ idempotentKey: '#data.orderNo', expireSeconds: 86400, waitForResultMs: 5000 })
  async create(@Payload() message: CreateOrderMessage): Promise<OrderView> {
    const { order } = await this.orders.create({ orderNo: message.orderNo, amount: message.amount }, message.userId);
    return order;
  }
}
