import { Module, type DynamicModule } from '@nestjs/common';
import { APP_FILTER, APP_GUARD, APP_PIPE } from '@nestjs/core';
import { TypeOrmModule } from '@nestjs/typeorm';
import { IdempotencyModule } from '../../../libs/idempotency/src/index.js';
import type { IdempotencyModuleOptions } from '../../../libs/idempotency/src/idempotency.options.js';
import { DemoExceptionFilter } from './demo-exception.filter.js';
import { DemoUserGuard } from './demo-user.guard.js';
import { DemoValidationPipe } from './demo-validation.pipe.js';
import { Order } from './orders/order.entity.js';
import { OrdersModule } from './orders/orders.module.js';

export interface AppModuleOptions {
  /** PostgreSQL connection URL. */
  databaseUrl: string;
  /** Redis URL of the idempotency store; without it the memory store (one process only) is used. */
  redisUrl?: string;
  /** First segment of every idempotency key. Default `demo`. */
  keyPrefix?: string;
}

@Module({})
export class AppModule {
  static register(options: AppModuleOptions): DynamicModule {
    const idempotency: IdempotencyModuleOptions = { keyPrefix: options.keyPrefix ?? 'demo' };
    if (options.redisUrl) idempotency.store = { redis: options.redisUrl };
    return {
      module: AppModule,
      imports: [
        TypeOrmModule.forRoot({
          type: 'postgres',
          url: options.databaseUrl,
          entities: [Order],
          // Until the migrations issue lands.
          synchronize: true,
          // gen_random_uuid() is built in since PostgreSQL 13; uuid-ossp may not be installed.
          uuidExtension: 'pgcrypto',
          retryAttempts: 2,
          retryDelay: 1000,
          extra: { connectionTimeoutMillis: 5000 },
        }),
        IdempotencyModule.forRoot(idempotency),
        OrdersModule,
      ],
      providers: [
        { provide: APP_GUARD, useClass: DemoUserGuard },
        { provide: APP_PIPE, useClass: DemoValidationPipe },
        { provide: APP_FILTER, useClass: DemoExceptionFilter },
      ],
    };
  }
}
