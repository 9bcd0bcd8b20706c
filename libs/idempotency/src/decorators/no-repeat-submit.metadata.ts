import { RequestMethod } from '@nestjs/common';
import { IdempotencyConfigError } from '../errors/idempotency.errors.js';
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
  /**
   * Set when a class-level decorator alone guards the route: the request methods it guards
   * (its `methods`), checked per request, as an `@All()` route takes every method.
   */
  requestMethods?: readonly string[];
}

/** HTTP methods a class-level `@NoRepeatSubmit()` guards unless its `methods` names others. */
export const UNSAFE_METHODS: readonly string[] = Object.freeze(['POST', 'PUT', 'PATCH', 'DELETE']);

/** `@nestjs/common`'s METHOD_METADATA: the `RequestMethod` of a route handler (none on message handlers). */
const METHOD_METADATA = 'method';

/**
 * The guard's settings for one handler of one controller, or undefined when it is not guarded.
 * The nearest decorator decides: the method's own (`@SkipIdempotency()` leaves it unguarded; a
 * `@NoRepeatSubmit()` guards it, its options merged over its controller's), else the nearest
 * class-level one up the controller's class chain (a subclass's over its base's). A class-level
 * `@NoRepeatSubmit()` guards its message handlers and the HTTP routes of its `methods` (default
 * POST, PUT, PATCH, DELETE: reads are not guarded; an `@All()` route only for those methods).
 * Per (controller, handler): subclasses of one base controller share its handler functions.
 */
export function guardedRouteMetadata(controller: object, handler: object): NoRepeatSubmitMetadata | undefined {
  if (Reflect.getMetadata(SKIP_IDEMPOTENCY_METADATA, handler)) return undefined;
  const own = Reflect.getMetadata(NO_REPEAT_SUBMIT_METADATA, handler) as NoRepeatSubmitMetadata | undefined;
  const onClass = nearestClassLevel(controller);
  if (own) return onClass ? merged(onClass, own) : own;
  if (!onClass) return undefined;
  const method = Reflect.getMetadata(METHOD_METADATA, handler) as RequestMethod | undefined;
  if (method === undefined) return onClass;
  const methods = onClass.options.methods ?? UNSAFE_METHODS;
  const name = RequestMethod[method];
  if (methods.includes('ALL')) return onClass;
  return name === 'ALL' || methods.includes(name) ? { ...onClass, requestMethods: methods } : undefined;
}

/** A method of a controller class: its property name, its function, the prototype that declares it. */
export interface ControllerMethod {
  name: string;
  handler: object;
  declaredOn: object;
}

/**
 * The methods of a controller prototype and of its bases, a subclass's own first (an override
 * hides its base's), as Nest's router sees them: string-named functions, no getters.
 */
export function controllerMethods(prototype: object): ControllerMethod[] {
  const seen = new Set<string>(['constructor']);
  const methods: ControllerMethod[] = [];
  for (let declaredOn: object | null = prototype; declaredOn && declaredOn !== Object.prototype; declaredOn = Object.getPrototypeOf(declaredOn)) {
    for (const name of Object.getOwnPropertyNames(declaredOn)) {
      if (seen.has(name)) continue;
      seen.add(name);
      const handler: unknown = Object.getOwnPropertyDescriptor(declaredOn, name)?.value;
      if (typeof handler === 'function') methods.push({ name, handler, declaredOn });
    }
  }
  return methods;
}

/** The class-level decorator nearest the controller: its own, else its base's; a skip is none. */
function nearestClassLevel(controller: object): NoRepeatSubmitMetadata | undefined {
  for (let type: object | null = controller; type && type !== Function.prototype; type = Object.getPrototypeOf(type)) {
    if (Reflect.getOwnMetadata(SKIP_IDEMPOTENCY_METADATA, type)) return undefined;
    const metadata = Reflect.getOwnMetadata(NO_REPEAT_SUBMIT_METADATA, type) as NoRepeatSubmitMetadata | undefined;
    if (metadata) return metadata;
  }
  return undefined;
}

/**
 * The method's options over the controller's (unset ones fall through; `ignoreFields` add up, as
 * the module's and a route's do), its key if it names one.
 */
function merged(onClass: NoRepeatSubmitMetadata, own: NoRepeatSubmitMetadata): NoRepeatSubmitMetadata {
  // Checked here, where the method meets the nearest class-level decorator up its class chain
  // (through inheritance or a mixin too; the decorator sees only its own class: helper-220).
  if (own.options.keyHeader !== undefined && own.options.idempotentKey === undefined && onClass.options.idempotentKey !== undefined) {
    throw keyHeaderUnused(own.where, own.options.keyHeader, onClass.where);
  }
  const options: NoRepeatSubmitOptions = { ...onClass.options };
  for (const [name, value] of Object.entries(own.options)) {
    if (value !== undefined) (options as Record<string, unknown>)[name] = value;
  }
  if (onClass.options.ignoreFields && own.options.ignoreFields) {
    options.ignoreFields = [...new Set([...onClass.options.ignoreFields, ...own.options.ignoreFields])];
  }
  return { options, key: own.options.idempotentKey === undefined ? onClass.key : own.key, where: own.where };
}

/**
 * A `keyHeader` on a route keyed by an `idempotentKey`: it did nothing, in silence (an adversarial
 * helper: two calls with other keys in the header and one body field got one answer).
 */
export const keyHeaderUnused = (where: string, keyHeader: string, keyedBy: string) =>
  new IdempotencyConfigError(
    `${where}: keyHeader ${keyHeader} would do nothing: the route is keyed by its idempotentKey (${keyedBy}'s). ` +
      `Key it by the header with idempotentKey: "#headers['${keyHeader.toLowerCase()}']", or drop keyHeader`,
  );
