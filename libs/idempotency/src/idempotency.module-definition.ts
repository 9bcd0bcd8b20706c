import { ConfigurableModuleBuilder, Inject, type DynamicModule, type Type } from '@nestjs/common';
import { IdempotencyConfigError } from './errors/idempotency.errors.js';
import { IdempotencyInterceptor } from './interceptors/idempotency.interceptor.js';
import { IdempotencyStore } from './stores/idempotency-store.js';
import type { IdempotencyModuleOptions } from './idempotency.options.js';

/**
 * What `forRoot()` and `forRootAsync()` take besides the options, because Nest needs them to
 * build the module itself (so `forRootAsync` takes them beside `useFactory`, not from it).
 */
export interface IdempotencyModuleExtras {
  /** Whether feature modules see the module without importing it. Default `true`. */
  isGlobal: boolean;
  /**
   * The guard `@NoRepeatSubmit()` runs: `IdempotencyInterceptor` (default) or a subclass of it,
   * e.g. one that overrides `getUser` or `getKey`. Nest builds it once, in this module: it may
   * inject this module's providers, global ones, and with `forRootAsync({ imports })` the
   * imported modules' exports. Give a subclass its own dependencies as properties
   * (`@Inject(Users) private readonly users!: Users`): the base constructor's parameters are not
   * part of the API. One that injects a request-scoped provider is built for every request (said
   * at start-up). Do not name it in `@UseInterceptors()`, `APP_INTERCEPTOR` or
   * `useGlobalInterceptors()` too: the app refuses to start.
   */
  interceptor: Type<IdempotencyInterceptor>;
}

/** The module's guard provider: `IdempotencyInterceptor` as the token, the chosen class behind it. */
function withGuard(definition: DynamicModule, { isGlobal, interceptor = IdempotencyInterceptor }: IdempotencyModuleExtras): DynamicModule {
  if (interceptor !== IdempotencyInterceptor && !(interceptor?.prototype instanceof IdempotencyInterceptor)) {
    throw new IdempotencyConfigError(
      `IdempotencyModule: interceptor must be IdempotencyInterceptor or a class that extends it (got ${String((interceptor as Type | undefined)?.name ?? interceptor)})`,
    );
  }
  return {
    ...definition,
    // Nest's builder copies a key given as undefined over the default (`isGlobal: config.global`
    // unset made the module not global: helper-220).
    global: isGlobal ?? true,
    providers: [...(definition.providers ?? []), { provide: IdempotencyInterceptor, useClass: interceptor }],
  };
}

export const {
  ConfigurableModuleClass: ConfigurableIdempotencyModule,
  MODULE_OPTIONS_TOKEN: IDEMPOTENCY_MODULE_OPTIONS,
  OPTIONS_TYPE: IDEMPOTENCY_OPTIONS_TYPE,
  ASYNC_OPTIONS_TYPE: IDEMPOTENCY_ASYNC_OPTIONS_TYPE,
} = new ConfigurableModuleBuilder<IdempotencyModuleOptions>({ moduleName: 'Idempotency' })
  .setClassMethodName('forRoot')
  .setExtras<IdempotencyModuleExtras>({ isGlobal: true, interceptor: IdempotencyInterceptor }, withGuard)
  .build();

/**
 * What `IdempotencyModule.forRootAsync({ useClass })` or `{ useExisting }` takes: a provider whose
 * `create()` returns the module options.
 */
export interface IdempotencyOptionsFactory {
  create(): IdempotencyModuleOptions | Promise<IdempotencyModuleOptions>;
}

/** Injects the module's store (`constructor(@InjectIdempotencyStore() store: IdempotencyStore)`). */
export const InjectIdempotencyStore = (): PropertyDecorator & ParameterDecorator => Inject(IdempotencyStore);
