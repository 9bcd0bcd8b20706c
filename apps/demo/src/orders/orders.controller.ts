import { Body, Controller, Get, HttpCode, HttpStatus, Param, Post, Res, UseGuards } from '@nestjs/common';
import { NoRepeatSubmit } from 'nestjs-idempotency';
import { CurrentUser } from '../current-user.decorator.js';
import type { DemoUser } from '../demo-user.js';
import { createdOrExisting, type StatusSetter } from '../http-response.js';
import { JsonBodyGuard } from '../json-body.guard.js';
import { CreateOrderDto } from './create-order.dto.js';
import { OrderNoPipe } from './order-no.pipe.js';
import type { OrderView } from './order.view.js';
import { OrdersService, type OrderChange } from './orders.service.js';
import { PaymentCallbackDto } from './payment-callback.dto.js';

/** Who owns an order created without `X-User-Id`. */
export const ANONYMOUS_USER_ID = 'anonymous';

@Controller('orders')
@UseGuards(JsonBodyGuard)
export class OrdersController {
  constructor(private readonly orders: OrdersService) {}

  /**
   * Creates an order: 201. A retry with the same orderNo (same user, same body) within a day gets
   * the first answer replayed by the guard; one that gets past the guard finds the order in the
   * database and gets it with 200. The same orderNo from another user gets 409.
   */
  @Post()
  @NoRepeatSubmit({ idempotentKey: '#body.orderNo', expireSeconds: 86400 })
  async create(
    @Body() dto: CreateOrderDto,
    @CurrentUser() user: DemoUser | undefined,
    @Res({ passthrough: true }) res: StatusSetter,
  ): Promise<OrderView> {
    const { created, order } = await this.orders.create(dto, user?.id ?? ANONYMOUS_USER_ID);
    createdOrExisting(res, created);
    return order;
  }

  @Get(':orderNo')
  findOne(@Param('orderNo', OrderNoPipe) orderNo: string): Promise<OrderView> {
    return this.orders.findByOrderNo(orderNo);
  }

  /**
   * The payment provider's callback; providers retry, so it is idempotent by the database alone:
   * 200 `{ changed: true, order }` the first time, 200 `{ changed: false, order }` after.
   */
  @Post(':orderNo/payment-callback')
  @HttpCode(HttpStatus.OK)
  paymentCallback(@Param('orderNo', OrderNoPipe) orderNo: string, @Body() dto: PaymentCallbackDto): Promise<OrderChange> {
    return this.orders.pay(orderNo, { transactionId: dto.transactionId, paidAt: new Date(dto.paidAt) });
  }

  /** PENDING → CANCELLED: 200 `{ changed, order }`, like the payment callback. */
  @Post(':orderNo/cancel')
  @HttpCode(HttpStatus.OK)
  cancel(@Param('orderNo', OrderNoPipe) orderNo: string): Promise<OrderChange> {
    return this.orders.cancel(orderNo);
  }
}
