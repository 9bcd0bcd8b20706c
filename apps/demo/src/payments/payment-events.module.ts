import { Module, type DynamicModule } from '@nestjs/common';
import { PaymentEventsConsumer } from './payment-events.consumer.js';
import { PAYMENT_EVENTS_OPTIONS, type PaymentEventsOptions } from './payment-events.options.js';

/** The `payment.succeeded` consumer; the app imports it only when a RabbitMQ URL is configured. */
@Module({})
export class PaymentEventsModule {
  static register(options: PaymentEventsOptions): DynamicModule {
    return {
      module: PaymentEventsModule,
      providers: [{ provide: PAYMENT_EVENTS_OPTIONS, useValue: options }, PaymentEventsConsumer],
      exports: [PaymentEventsConsumer],
    };
  }
}
