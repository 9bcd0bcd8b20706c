import { RequestMethod, SetMetadata, UseInterceptors, applyDecorators } from '@nestjs/common';
import { IdempotencyConfigError } from '../errors/idempotency.errors.js';
import { assertBoolean, assertBytes, assertKnownOptions, ROUTE_OPTIONS, assertErrorFormat, assertFunction, assertPositive, assertSaveStatuses, assertShared, MAX_TIMED_SECONDS, shown } from '../idempotency.config.js';
import { NO_REPEAT_SUBMIT_METADATA, SKIP_IDEMPOTENCY_METADATA } from '../idempotency.constants.js';
import type { NoRepeatSubmitOptions } from '../idempotency.options.js';
import { NoRepeatSubmitInterceptor } from '../interceptors/no-repeat-submit.interceptor.js';
import { parseKeyExpression } from '../keys/key-expression.js';
import { keyHeaderUnused, type NoRepeatSubmitMetadata } from './no-repeat-submit.metadata.js';

/**
 * Leaves a route (or every route of a controller) unguarded, under a class-level
 * `@NoRepeatSubmit()` or a method-level one alike.
 */
export const SkipIdempotency = (): ClassDecorator & MethodDecorator => SetMetadata(SKIP_IDEMPOTENCY_METADATA, true);

/**
 * Guards a controller method (or the POST, PUT, PATCH and DELETE routes and the message handlers
 * of a controller: see `methods`) against duplicate submits:
 * the first request runs and its response is saved; duplicates get that response replayed
 * (`Idempotent-Replayed: true`), 409 while it runs, 422 when the key comes with another payload.
 *
 * @example
 * ```ts
 * @Post()
 * @NoRepeatSubmit({ idempotentKey: '#body.orderNo', expireSeconds: 86400 })
 * create(@Body() dto: CreateOrderDto) { ... }
 * ```
 * A method's options merge over its controller's, which merge over the module's. A bad key
 * expression or option throws an `IdempotencyConfigError` naming the method at start-up.
 */
export function NoRepeatSubmit(options: NoRepeatSubmitOptions = {}): ClassDecorator & MethodDecorator {
  return (target: object, propertyKey?: string | symbol, descriptor?: PropertyDescriptor) => {
    const className = typeof target === 'function' ? target.name : target.constructor.name;
    const where = propertyKey === undefined ? className : `${className}.${String(propertyKey)}`;
    assertKnownOptions(options, ROUTE_OPTIONS, where);
    assertPositive('expireSeconds', options.expireSeconds, where);
    assertPositive('leaseSeconds', options.leaseSeconds, where);
    assertPositive('maxHoldSeconds', options.maxHoldSeconds, where);
    assertBytes(options.maxResponseBytes, where);
    assertSaveStatuses(options.saveStatuses, where);
    assertErrorFormat(options.errorFormat, where);
    assertShared(options, where);
    assertBoolean('useRequestFingerprint', options.useRequestFingerprint, where);
    assertFunction('skipIf', options.skipIf, where);
    if (options.methods !== undefined && !Array.isArray(options.methods)) {
      throw new IdempotencyConfigError(`${where}: methods must be a list of HTTP methods, e.g. ['POST'] (got ${shown(options.methods)})`);
    }
    const { waitForResultMs } = options as { waitForResultMs?: unknown };
    if (waitForResultMs !== undefined && !(typeof waitForResultMs === 'number' && waitForResultMs >= 0 && waitForResultMs <= MAX_TIMED_SECONDS * 1000)) {
      throw new IdempotencyConfigError(
        `${where}: waitForResultMs must be a number of milliseconds, 0 or more, at most ${(MAX_TIMED_SECONDS * 1000).toLocaleString('en')} (got ${shown(waitForResultMs)})`,
      );
    }
    const unknown = options.methods?.filter((method) => typeof RequestMethod[method as keyof typeof RequestMethod] !== 'number');
    if (unknown?.length) throw new IdempotencyConfigError(`${where}: methods holds unknown HTTP methods (${unknown.join(', ')})`);
    // Each of these did nothing, in silence (an adversarial helper): a method's decorator guards
    // its route whatever its method; an empty list guarded no route of the controller; HEAD is never guarded.
    if (options.methods !== undefined && propertyKey !== undefined) {
      throw new IdempotencyConfigError(`${where}: methods applies to a controller's routes; on a method, @NoRepeatSubmit() guards its route whatever its method`);
    }
    if (options.methods?.length === 0 || options.methods?.includes('HEAD' as never)) {
      throw new IdempotencyConfigError(`${where}: methods must name the request methods to guard, HEAD not among them (a HEAD request is never guarded)`);
    }
    const { idempotentKey } = options;
    // In one decorator; a method's under its class's is checked where the guard merges them.
    if (idempotentKey !== undefined && options.keyHeader !== undefined) throw keyHeaderUnused(where, options.keyHeader, where);
    const key: NoRepeatSubmitMetadata['key'] =
      typeof idempotentKey === 'function'
        ? { resolve: idempotentKey }
        : idempotentKey === undefined
          ? { header: true }
          : { path: parseKeyExpression(idempotentKey, where) };
    // Two on one method (or one class): the outer one's metadata replaced the inner one's whole,
    // with no word, and a custom decorator's key expression was lost (an adversarial helper: a
    // route keyed by #body.orderNo ran every copy under an outer @NoRepeatSubmit({ required: false })).
    // The same options again (code that decorates a shared method once per subclass, a helper
    // called twice) lose nothing: allowed (a reviewing helper).
    const decorated = propertyKey === undefined ? target : descriptor?.value;
    const before = decorated ? (Reflect.getOwnMetadata(NO_REPEAT_SUBMIT_METADATA, decorated as object) as NoRepeatSubmitMetadata | undefined) : undefined;
    if (before && !sameOptions(before.options, options)) {
      throw new IdempotencyConfigError(
        `${where} has two @NoRepeatSubmit() decorators (one may come from a decorator of your own, through applyDecorators): ` +
          'the outer one would replace the inner one whole. Give it one, with all its options.',
      );
    }
    const metadata: NoRepeatSubmitMetadata = { options, key, where };
    const decorate = applyDecorators(
      SetMetadata(NO_REPEAT_SUBMIT_METADATA, metadata),
      // Runs the module's guard: IdempotencyInterceptor, or forRoot({ interceptor })'s subclass.
      UseInterceptors(NoRepeatSubmitInterceptor),
    );
    decorate(target, propertyKey!, descriptor!);
  };
}

/** Whether two decorators' options say the same: each option the same value (lists by their items). */
function sameOptions(a: NoRepeatSubmitOptions, b: NoRepeatSubmitOptions): boolean {
  const names = new Set([...Object.keys(a), ...Object.keys(b)]) as Set<keyof NoRepeatSubmitOptions>;
  for (const name of names) {
    const [x, y] = [a[name], b[name]];
    if (x === y) continue;
    if (!(Array.isArray(x) && Array.isArray(y) && x.length === y.length && x.every((item, i) => item === y[i]))) return false;
  }
  return true;
}
