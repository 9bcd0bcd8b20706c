import { Module } from '@nestjs/common';
import { ModulesContainer } from '@nestjs/core';
import { placeGuards } from './interceptors/guard-placement.js';
import { IdempotencyCounters } from './metrics/idempotency-counters.js';
import { createPrometheusSink } from './metrics/prometheus-metrics.js';
import { documentDecoratedRoutes } from './openapi/idempotency-openapi.js';
import { IDEMPOTENCY_RESOLVED_OPTIONS, resolveOptions, type ResolvedIdempotencyOptions } from './idempotency.config.js';
import { ConfigurableIdempotencyModule, IDEMPOTENCY_MODULE_OPTIONS } from './idempotency.module-definition.js';
import type { IdempotencyModuleOptions } from './idempotency.options.js';
import { createStore } from './stores/create-store.js';
import { IdempotencyStore } from './stores/idempotency-store.js';

const IDEMPOTENCY_OPENAPI = Symbol('IDEMPOTENCY_OPENAPI');
const IDEMPOTENCY_PLACEMENT = Symbol('IDEMPOTENCY_PLACEMENT');

/**
 * Registers the store and the interceptor behind `@NoRepeatSubmit()`. Global by default
 * (`isGlobal: false` to scope it). `IdempotencyModule.forRoot({...})` or
 * `IdempotencyModule.forRootAsync({ imports, inject, useFactory })`.
 */
@Module({
  providers: [
    {
      provide: IDEMPOTENCY_RESOLVED_OPTIONS,
      inject: [IDEMPOTENCY_MODULE_OPTIONS],
      useFactory: (options: IdempotencyModuleOptions) => resolveOptions(options),
    },
    {
      provide: IdempotencyStore,
      inject: [IDEMPOTENCY_MODULE_OPTIONS],
      useFactory: (options: IdempotencyModuleOptions) => createStore(options),
    },
    {
      provide: IdempotencyCounters,
      inject: [IDEMPOTENCY_MODULE_OPTIONS],
      useFactory: async ({ metrics }: IdempotencyModuleOptions) =>
        new IdempotencyCounters(metrics ? await createPrometheusSink(metrics === true ? {} : metrics) : undefined),
    },
    {
      // Places the guard innermost on each guarded handler; runs while the app is created, so
      // before its routes are built.
      provide: IDEMPOTENCY_PLACEMENT,
      inject: [ModulesContainer],
      useFactory: placeGuards,
    },
    {
      // Documents decorated routes in OpenAPI when @nestjs/swagger is installed; resolved while
      // the app is created, so before SwaggerModule.createDocument().
      provide: IDEMPOTENCY_OPENAPI,
      inject: [IDEMPOTENCY_RESOLVED_OPTIONS],
      useFactory: (options: ResolvedIdempotencyOptions) => documentDecoratedRoutes(options),
    },
  ],
  exports: [IDEMPOTENCY_RESOLVED_OPTIONS, IdempotencyStore, IdempotencyCounters],
})
export class IdempotencyModule extends ConfigurableIdempotencyModule {}
