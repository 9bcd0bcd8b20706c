import { RequestMethod } from '@nestjs/common';
import { NO_REPEAT_SUBMIT_METADATA, SKIP_IDEMPOTENCY_METADATA } from '../idempotency.constants.js';
import type { KeyResolver, NoRepeatSubmitOptions } from '../idempotency.options.js';
import type { KeyPath } from '../keys/key-expression.js';

/** What `@NoRepeatSubmit()` records on a handler or controller, checked when the class loads. */
export interface NoRepeatSubmitMetadata {
  options: NoRepeatSubmitOptions;
  /** Where the key comes from: a parsed expression, a function, or the Idempotency-Key header. */
  key: { path: KeyPath } | { resolve: KeyResolver } | { header: true };
  /** `Controller.method` (or the controller's name on a class), for messages. */
  where: string;
}

/** HTTP methods a class-level `@NoRepeatSubmit()` guards unless its `methods` names others. */
export const UNSAFE_METHODS: readonly string[] = Object.freeze(['POST', 'PUT', 'PATCH', 'DELETE']);

/** `@nestjs/common`'s METHOD_METADATA: the `RequestMethod` of a route handler (none on message handlers). */
const METHOD_METADATA = 'method';

/**
 * The guard's settings for one handler of one controller, or undefined when it is not guarded:
 * - `@SkipIdempotency()` on the handler (or the controller) leaves it unguarded;
 * - a method-level `@NoRepeatSubmit()` guards it, its options merged over the controller's;
 * - a class-level one alone guards its message handlers and its HTTP routes whose method is in
 *   its `methods` (default POST, PUT, PATCH, DELETE: reads are not guarded).
 * Per (controller, handler): subclasses of one base controller share its handler functions.
 */
export function guardedRouteMetadata(controller: object, handler: object): NoRepeatSubmitMetadata | undefined {
  if (Reflect.getMetadata(SKIP_IDEMPOTENCY_METADATA, handler) || Reflect.getMetadata(SKIP_IDEMPOTENCY_METADATA, controller)) {
    return undefined;
  }
  const own = Reflect.getMetadata(NO_REPEAT_SUBMIT_METADATA, handler) as NoRepeatSubmitMetadata | undefined;
  const onClass = Reflect.getMetadata(NO_REPEAT_SUBMIT_METADATA, controller) as NoRepeatSubmitMetadata | undefined;
  if (own) return onClass ? merged(onClass, own) : own;
  if (!onClass) return undefined;
  const method = Reflect.getMetadata(METHOD_METADATA, handler) as RequestMethod | undefined;
  if (method === undefined) return onClass;
  return (onClass.options.methods ?? UNSAFE_METHODS).includes(RequestMethod[method]) ? onClass : undefined;
}

/** The method's options over the controller's (unset ones fall through), its key if it names one. */
function merged(onClass: NoRepeatSubmitMetadata, own: NoRepeatSubmitMetadata): NoRepeatSubmitMetadata {
  const options: NoRepeatSubmitOptions = { ...onClass.options };
  for (const [name, value] of Object.entries(own.options)) {
    if (value !== undefined) (options as Record<string, unknown>)[name] = value;
  }
  return { options, key: own.options.idempotentKey === undefined ? onClass.key : own.key, where: own.where };
}
