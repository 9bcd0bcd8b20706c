import { Module, type DynamicModule } from '@nestjs/common';
import { APP_FILTER, APP_GUARD, APP_PIPE } from '@nestjs/core';
import { TypeOrmModule } from '@nestjs/typeorm';
import { IdempotencyModule, type IdempotencyModuleOptions } from 'nestjs-idempotency';
import {
  IDEMPOTENCY_ENTITIES,
  IDEMPOTENCY_MIGRATIONS,
  IDEMPOTENCY_OUTCOME_ENTITIES,
  IDEMPOTENCY_OUTCOME_MIGRATIONS,
} from 'nestjs-idempotency/typeorm';
import { AdminModule } from './admin/admin.module.js';
import { DemoExceptionFilter } from './demo-exception.filter.js';
import { DemoUserGuard } from './demo-user.guard.js';
import { DemoValidationPipe } from './demo-validation.pipe.js';
import { Invoice } from './invoices/invoice.entity.js';
import { InvoicesModule } from './invoices/invoices.module.js';
import { DEMO_MIGRATIONS } from './migrations/index.js';
import { Order } from './orders/order.entity.js';
import { OpsModule } from './ops/ops.module.js';
import { OrdersModule } from './orders/orders.module.js';
import { PaymentEventsModule } from './payments/payment-events.module.js';
import { Payment } from './payments/payment.entity.js';
import { PaymentsModule } from './payments/payments.module.js';
import type { PaymentEventsFaults } from './payments/payment-events.options.js';
import { UploadsModule } from './uploads/uploads.module.js';
import type { UploadsOptions } from './uploads/uploads.options.js';
import { XmlUpload } from './uploads/xml-upload.entity.js';

/** The demo's lease: a few seconds, renewed while a handler runs. */
const DEMO_LEASE_SECONDS = 5;

export interface AppModuleOptions {
  /** PostgreSQL connection URL. */
  databaseUrl: string;
  /** Redis URL of the idempotency store; without it the memory store (one process only) is used. */
  redisUrl?: string;
  /** First segment of every idempotency key. Default `demo`. */
  keyPrefix?: string;
  /**
   * How long an idempotency claim holds without renewal, in seconds. Default 5: the guard renews
   * it while a handler runs, so a short lease frees a crashed process's keys fast.
   */
  leaseSeconds?: number;
  /** AMQP URL of RabbitMQ; without it the `payment.succeeded` consumer is off. */
  rabbitmqUrl?: string;
  /** Queue of `payment.succeeded` messages. Default `payment.succeeded`. */
  paymentQueue?: string;
  /** Queue rejected payment messages are dead-lettered to (see `PaymentEventsOptions.deadLetterQueue`). Default none. */
  paymentDeadLetterQueue?: string;
  /** Failed attempts after which a payment message is rejected (see `PaymentEventsOptions.maxAttempts`). Default 5. */
  paymentMaxAttempts?: number;
  /** Wait before a failed payment message is put back, ms. Default 1000. */
  paymentRequeueDelayMs?: number;
  /** FOR TESTS ONLY: faults the payment consumer injects once each (see `PaymentEventsFaults`). */
  paymentEventsFaults?: PaymentEventsFaults;
  /** XML uploads: body limit, lease, retention, purge interval (see `UploadsOptions`). */
  uploads?: UploadsOptions;
  /**
   * The `X-Admin-Token` the admin routes (`/admin/idempotency/...`) want, at least 16
   * characters. Without it they answer 404: off.
   */
  adminToken?: string;
}

/** Every entity of the demo's database: the library's tables and the demo's own. */
export const DEMO_ENTITIES = [...IDEMPOTENCY_ENTITIES, ...IDEMPOTENCY_OUTCOME_ENTITIES, Order, Invoice, XmlUpload, Payment];

@Module({})
export class AppModule {
  static register(options: AppModuleOptions): DynamicModule {
    const idempotency: IdempotencyModuleOptions = {
      keyPrefix: options.keyPrefix ?? 'demo',
      leaseSeconds: options.leaseSeconds ?? DEMO_LEASE_SECONDS,
      metrics: true,
    };
    if (options.redisUrl) idempotency.store = { redis: options.redisUrl };
    const paymentEvents = options.rabbitmqUrl
      ? [
          PaymentEventsModule.register({
            url: options.rabbitmqUrl,
            queue: options.paymentQueue,
            deadLetterQueue: options.paymentDeadLetterQueue,
            maxAttempts: options.paymentMaxAttempts,
            requeueDelayMs: options.paymentRequeueDelayMs,
            faults: options.paymentEventsFaults,
          }),
        ]
      : [];
    return {
      module: AppModule,
      imports: [
        TypeOrmModule.forRoot({
          type: 'postgres',
          url: options.databaseUrl,
          entities: DEMO_ENTITIES,
          // The schema comes from migrations only, run at start-up (each once: TypeORM records
          // them in its `migrations` table, in one transaction).
          migrations: [...IDEMPOTENCY_MIGRATIONS, ...IDEMPOTENCY_OUTCOME_MIGRATIONS, ...DEMO_MIGRATIONS],
          migrationsRun: true,
          synchronize: false,
          // gen_random_uuid() is built in since PostgreSQL 13; uuid-ossp may not be installed.
          uuidExtension: 'pgcrypto',
          retryAttempts: 2,
          retryDelay: 1000,
          extra: { connectionTimeoutMillis: 5000 },
        }),
        IdempotencyModule.forRoot(idempotency),
        OrdersModule,
        PaymentsModule,
        InvoicesModule,
        UploadsModule.register(options.uploads),
        OpsModule,
        AdminModule.register(options.adminToken),
        ...paymentEvents,
      ],
      providers: [
        { provide: APP_GUARD, useClass: DemoUserGuard },
        { provide: APP_PIPE, useClass: DemoValidationPipe },
        { provide: APP_FILTER, useClass: DemoExceptionFilter },
      ],
    };
  }
}
