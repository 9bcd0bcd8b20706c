import { Body, Controller, Get, HttpCode, HttpStatus, Param, Post, UseGuards } from '@nestjs/common';
import { NoRepeatSubmit } from '../../../../libs/idempotency/src/index.js';
import { CurrentUser } from '../current-user.decorator.js';
import type { DemoUser } from '../demo-user.js';
import { JsonBodyGuard } from '../json-body.guard.js';
import { CreateOrderDto } from './create-order.dto.js';
import type { OrderView } from './order.view.js';
import { OrdersService } from './orders.service.js';

/** Who owns an order created without `X-User-Id`. */
export const ANONYMOUS_USER_ID = 'anonymous';

@Controller('orders')
@UseGuards(JsonBodyGuard)
export class OrdersController {
  constructor(private readonly orders: OrdersService) {}

  /**
   * Creates an order. A retry with the same orderNo (same user, same body) within a day gets the
   * first answer replayed; the same orderNo from another user reaches the database and gets 409.
   */
  @Post()
  @HttpCode(HttpStatus.CREATED)
  @NoRepeatSubmit({ idempotentKey: '#body.orderNo', expireSeconds: 86400 })
  create(@Body() dto: CreateOrderDto, @CurrentUser() user: DemoUser | undefined): Promise<OrderView> {
    return this.orders.create(dto, user?.id ?? ANONYMOUS_USER_ID);
  }

  @Get(':orderNo')
  findOne(@Param('orderNo') orderNo: string): Promise<OrderView> {
    return this.orders.findByOrderNo(orderNo);
  }
}
