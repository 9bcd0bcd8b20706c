import { Module } from '@nestjs/common';
import { TypeOrmModule } from '@nestjs/typeorm';
import { provideIdempotentTransactions } from 'nestjs-idempotency/typeorm';
import { Payment } from './payment.entity.js';
import { PaymentsController } from './payments.controller.js';
import { PaymentsService } from './payments.service.js';

/** `POST /payments` and `GET /orders/:orderNo/payments`: the transactional mode on PostgreSQL. */
@Module({
  imports: [TypeOrmModule.forFeature([Payment])],
  controllers: [PaymentsController],
  providers: [provideIdempotentTransactions({ retentionMs: 24 * 60 * 60 * 1000 }), PaymentsService],
})
export class PaymentsModule {}
