import { Injectable, type CallHandler, type ExecutionContext, type NestInterceptor } from '@nestjs/common';
import type { Observable } from 'rxjs';
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
  constructor(private readonly guard: IdempotencyInterceptor) {}

  intercept(ctx: ExecutionContext, next: CallHandler): Observable<unknown> {
    return this.guard.intercept(ctx, next);
  }
}
