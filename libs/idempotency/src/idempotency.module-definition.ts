import { ConfigurableModuleBuilder, Inject } from '@nestjs/common';
import { IdempotencyStore } from './stores/idempotency-store.js';
import type { IdempotencyModuleOptions } from './idempotency.options.js';

export const {
  ConfigurableModuleClass: ConfigurableIdempotencyModule,
  MODULE_OPTIONS_TOKEN: IDEMPOTENCY_MODULE_OPTIONS,
  OPTIONS_TYPE: IDEMPOTENCY_OPTIONS_TYPE,
  ASYNC_OPTIONS_TYPE: IDEMPOTENCY_ASYNC_OPTIONS_TYPE,
} = new ConfigurableModuleBuilder<IdempotencyModuleOptions>({ moduleName: 'Idempotency' })
  .setClassMethodName('forRoot')
  .setExtras({ isGlobal: true }, (definition, extras) => ({ ...definition, global: extras.isGlobal }))
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
