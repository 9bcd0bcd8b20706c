import { Body, Controller, Get, Param, Post, Req, Res, UseGuards } from '@nestjs/common';
import { IdempotencyRefusals, readKeyHeader, type RequestHeaders } from 'nestjs-idempotency';
import { answerHttp, type HttpReply } from 'nestjs-idempotency/typeorm';
import { CurrentUser } from '../current-user.decorator.js';
import type { DemoUser } from '../demo-user.js';
import { JsonBodyGuard } from '../json-body.guard.js';
import { ANONYMOUS_USER_ID } from '../orders/orders.controller.js';
import { OrderNoPipe } from '../orders/order-no.pipe.js';
import { CreatePaymentDto } from './create-payment.dto.js';
import { PaymentsService, type PaymentView } from './payments.service.js';

/**
 * Payments in the transactional mode: no `@NoRepeatSubmit` here. The key, the payment row and
 * the answer commit in one PostgreSQL transaction (`IdempotentTransactions`), so even a crash
 * between the payment's write and the answer leaves both or neither.
 */
@Controller()
export class PaymentsController {
  constructor(private readonly payments: PaymentsService) {}

  /**
   * Pays an order, once per `Idempotency-Key` (per user): 201 `{ id, orderNo, amount, userId,
   * createdAt }`. A retry with the key gets the same payment, `Idempotent-Replayed: true`; while
   * the first runs, 409 `IDEMPOTENCY_IN_PROGRESS`; the key with another body, 422
   * `IDEMPOTENCY_KEY_REUSED`; no key, 400 `IDEMPOTENCY_KEY_MISSING`; an unknown order, 404
   * `ORDER_NOT_FOUND` (and nothing recorded: the retry may run again).
   */
  @Post('payments')
  @UseGuards(JsonBodyGuard)
  async pay(
    @Req() req: RequestHeaders,
    @Body() dto: CreatePaymentDto,
    @CurrentUser() user: DemoUser | undefined,
    @Res({ passthrough: true }) reply: HttpReply,
  ): Promise<PaymentView> {
    // From the request, not @Headers(): Node joins a header sent on two lines into one value.
    const parsed = readKeyHeader(req);
    if (!parsed) throw IdempotencyRefusals.keyMissing('the Idempotency-Key header');
    if ('invalid' in parsed) throw IdempotencyRefusals.keyInvalid(parsed.invalid);
    const result = await this.payments.pay(user?.id ?? ANONYMOUS_USER_ID, parsed.key, dto);
    return answerHttp(result, reply);
  }

  /** The payments recorded for an order (anyone can count them): 200 `PaymentView[]`, oldest first. */
  @Get('orders/:orderNo/payments')
  ofOrder(@Param('orderNo', OrderNoPipe) orderNo: string): Promise<PaymentView[]> {
    return this.payments.ofOrder(orderNo);
  }
}
