import { Module, type DynamicModule, type Provider } from '@nestjs/common';
import { ModulesContainer } from '@nestjs/core';
import { IdempotencyAdmin } from './admin/idempotency-admin.service.js';
import { IdempotencyEvents } from './events/idempotency-events.js';
import { GuardMemory } from './interceptors/guard-memory.js';
import { placeGuards } from './interceptors/guard-placement.js';
import { IdempotencyInterceptor } from './interceptors/idempotency.interceptor.js';
import { passportUser } from './interceptors/passport-user.js';
import { IdempotencyCounters } from './metrics/idempotency-counters.js';
import { metricsListener } from './metrics/metrics-listener.js';
import { createPrometheusSink } from './metrics/prometheus-metrics.js';
import { routeDocumenter, type RouteDocumenter } from './openapi/idempotency-openapi.js';
import { IDEMPOTENCY_RESOLVED_OPTIONS, assertAsyncOptions, givenOptions, resolveOptions, type ResolvedIdempotencyOptions } from './idempotency.config.js';
import {
  ConfigurableIdempotencyModule,
  IDEMPOTENCY_ASYNC_OPTIONS_TYPE,
  IDEMPOTENCY_MODULE_OPTIONS,
  IDEMPOTENCY_OPTIONS_TYPE,
} from './idempotency.module-definition.js';
import type { IdempotencyModuleOptions } from './idempotency.options.js';
import { createStore } from './stores/create-store.js';
import { IdempotencyStore } from './stores/idempotency-store.js';

const IDEMPOTENCY_OPENAPI = Symbol('IDEMPOTENCY_OPENAPI');
const IDEMPOTENCY_PLACEMENT = Symbol('IDEMPOTENCY_PLACEMENT');
const IDEMPOTENCY_PASSPORT_USER = Symbol('IDEMPOTENCY_PASSPORT_USER');

/** What `forRoot()` / `forRootAsync()` provide (the guard itself is the module definition's). */
const PROVIDERS: Provider[] = [
  {
    provide: IDEMPOTENCY_RESOLVED_OPTIONS,
    inject: [IDEMPOTENCY_MODULE_OPTIONS],
    useFactory: (options: IdempotencyModuleOptions) => resolveOptions(givenOptions(options)),
  },
  {
    provide: IdempotencyStore,
    inject: [IDEMPOTENCY_MODULE_OPTIONS],
    useFactory: (options: IdempotencyModuleOptions) => createStore(givenOptions(options)),
  },
  // Totals in process; the metrics, like `onEvent`, listen to the events.
  { provide: IdempotencyCounters, useFactory: () => new IdempotencyCounters() },
  {
    provide: IdempotencyEvents,
    inject: [IDEMPOTENCY_MODULE_OPTIONS],
    useFactory: async (options: IdempotencyModuleOptions) => {
      const { metrics, onEvent } = givenOptions(options);
      const events = new IdempotencyEvents();
      if (metrics) events.subscribe(metricsListener(await createPrometheusSink(metrics === true ? {} : metrics)));
      if (onEvent) events.subscribe(onEvent);
      return events;
    },
  },
  {
    // Places the guard innermost on each guarded handler, and documents the routes this module
    // guards in OpenAPI (with @nestjs/swagger installed); runs while the app is created, so
    // before its routes are built and before SwaggerModule.createDocument().
    provide: IDEMPOTENCY_PLACEMENT,
    inject: [ModulesContainer, IDEMPOTENCY_RESOLVED_OPTIONS, IDEMPOTENCY_OPENAPI],
    useFactory: (modules: ModulesContainer, options: ResolvedIdempotencyOptions, documenter: RouteDocumenter | undefined) =>
      placeGuards(modules, options, documenter),
  },
  // What documents routes in OpenAPI: undefined without @nestjs/swagger.
  { provide: IDEMPOTENCY_OPENAPI, useFactory: routeDocumenter },
  {
    // Where Passport puts the user, when the app registered it with another `property`.
    provide: IDEMPOTENCY_PASSPORT_USER,
    inject: [IDEMPOTENCY_RESOLVED_OPTIONS, ModulesContainer],
    useFactory: (options: ResolvedIdempotencyOptions, modules: ModulesContainer) => passportUser(options.userLocation, modules),
  },
  IdempotencyAdmin,
  // What the guard remembers per route, kept here: Nest may build a subclass once per request.
  GuardMemory,
];

/**
 * IdempotencyInterceptor: the guard @NoRepeatSubmit() runs, provided by the module definition
 * (forRoot({ interceptor })), exported for NoRepeatSubmitInterceptor in each controller's module.
 * GuardMemory too: Nest builds a guard class named by hand (@UseInterceptors, APP_INTERCEPTOR)
 * where it is named, before start-up takes it off or refuses it.
 */
const EXPORTS = [IDEMPOTENCY_RESOLVED_OPTIONS, IdempotencyStore, IdempotencyCounters, IdempotencyEvents, IdempotencyAdmin, IdempotencyInterceptor, GuardMemory];

/** The module `forRoot()` / `forRootAsync()` made, with what it provides and exports. */
const withProviders = (definition: DynamicModule): DynamicModule => ({
  ...definition,
  providers: [...(definition.providers ?? []), ...PROVIDERS],
  exports: [...(definition.exports ?? []), ...EXPORTS],
});

/**
 * Registers the store and the interceptor behind `@NoRepeatSubmit()`. Global by default
 * (`isGlobal: false` to scope it). `IdempotencyModule.forRoot({...})` or
 * `IdempotencyModule.forRootAsync({ imports, inject, useFactory })`. The class alone
 * (`imports: [IdempotencyModule]` in a feature module, as with other Nest modules) provides
 * nothing: the global module `forRoot()` made serves it (Nest's UnknownExportException before,
 * an adversarial helper's first ten minutes).
 */
@Module({})
export class IdempotencyModule extends ConfigurableIdempotencyModule {
  /** The module, global by default; `forRoot()` alone is the memory store with every default (`forRoot({})`). */
  static override forRoot(options: typeof IDEMPOTENCY_OPTIONS_TYPE = {}): DynamicModule {
    return withProviders(super.forRoot(options));
  }

  static override forRootAsync(options: typeof IDEMPOTENCY_ASYNC_OPTIONS_TYPE): DynamicModule {
    assertAsyncOptions(options);
    return withProviders(super.forRootAsync(options));
  }
}
