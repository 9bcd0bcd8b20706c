import { Injectable, Optional, type CallHandler, type ExecutionContext, type NestInterceptor } from '@nestjs/common';
import type { Observable } from 'rxjs';
import { IdempotencyConfigError } from '../errors/idempotency.errors.js';
import { IdempotencyInterceptor } from './idempotency.interceptor.js';

/**
 * What `@NoRepeatSubmit()` applies, and what hands each call to the guard. Nest builds the
 * classes `@UseInterceptors()` names while it scans the app, in each module that has a guarded
 * controller, before any module option is known; so the decorator always names this class, and
 * it runs the module's `IdempotencyInterceptor` provider: the guard, or the subclass given as
 * `IdempotencyModule.forRoot({ interceptor })`, built once by Nest with its own dependencies.
 * A property read and a call per request.
 */
@Injectable()
export class NoRepeatSubmitInterceptor implements NestInterceptor {
  constructor(@Optional() private readonly guard: IdempotencyInterceptor) {
    // Nest's own error named only an unresolved dependency at index [0] (an adversarial helper).
    if (!guard) {
      throw new IdempotencyConfigError(
        '@NoRepeatSubmit() is used in a module that does not see IdempotencyModule: import IdempotencyModule.forRoot({...}) ' +
          '(or forRootAsync) in the root module (it is global by default), or, with isGlobal: false, in the module of the guarded controller',
      );
    }
  }

  intercept(ctx: ExecutionContext, next: CallHandler): Observable<unknown> {
    return this.guard.intercept(ctx, next);
  }
}
