import { Logger, type NestInterceptor, type OnApplicationBootstrap, type Type } from '@nestjs/common';
import { APP_INTERCEPTOR, type ModulesContainer } from '@nestjs/core';
import { IDEMPOTENCY_RESOLVED_OPTIONS, savesStatus, type ResolvedIdempotencyOptions } from '../idempotency.config.js';
import type { RouteDocumenter } from '../openapi/idempotency-openapi.js';
import { CONTENT_DIGEST_METADATA, type ContentDigestOptions } from '../content-digest/content-digest.guard.js';
import { IdempotencyConfigError } from '../errors/idempotency.errors.js';
import { controllerMethods, guardedRouteMetadata, type NoRepeatSubmitMetadata } from '../decorators/no-repeat-submit.metadata.js';
import { NO_REPEAT_SUBMIT_METADATA, SKIP_IDEMPOTENCY_METADATA } from '../idempotency.constants.js';
import { describeKeyPath } from '../keys/key-expression.js';
import { dropForeignMarks, markMethodStart, watchRouteMethod } from './handler-start.js';
import { noteRoutedModules } from './route-paths.js';
import { IdempotencyInterceptor } from './idempotency.interceptor.js';
import { NoRepeatSubmitInterceptor } from './no-repeat-submit.interceptor.js';

/** Metadata keys of `@nestjs/common` and `@nestjs/microservices` (stable across Nest 10-12). */
const INTERCEPTORS_METADATA = '__interceptors__';
const PATH_METADATA = 'path';
const PATTERN_METADATA = 'microservices:pattern';
const SSE_METADATA = '__sse__';

type Interceptors = unknown[];
const interceptorsOf = (target: object): Interceptors => Reflect.getMetadata(INTERCEPTORS_METADATA, target) ?? [];
/** The decorator's entry, or the guard named by hand: either runs the guard. */
const isGuard = (item: unknown) => item === NoRepeatSubmitInterceptor || item === IdempotencyInterceptor;
const withoutGuard = (list: Interceptors) => list.filter((item) => !isGuard(item));
const isGuardSubclass = (item: unknown): item is Type =>
  typeof item === 'function' && item.prototype instanceof IdempotencyInterceptor;
/** A class that guards whatever `@NoRepeatSubmit()` route it is applied to. */
const isGuardClass = (item: unknown): item is Type => isGuard(item) || isGuardSubclass(item);

/** What Nest keeps of the app's global interceptors (`@nestjs/core`'s `ApplicationConfig`). */
interface GlobalInterceptors {
  getGlobalInterceptors(): NestInterceptor[];
  getGlobalRequestInterceptors?(): { metatype: unknown }[];
}

/**
 * Puts the guard where it sees the handler itself: last (innermost) among each guarded handler's
 * interceptors. Nest runs class-level interceptors outside method-level ones, and a method's in
 * the order their decorators apply (bottom-up), so a `@UseInterceptors(Timeout)` under a
 * class-level `@NoRepeatSubmit`, or written above the method's, would run inside the guard: its
 * 408 would look like the handler failing, and free the key while the handler still runs.
 * Also, once per app, before the routes are built:
 * - refuses two guarded handlers of different classes with one `Controller.method` name (their
 *   keys would share records: one route would replay the other's answers);
 * - refuses a subclass of the guard named with `@UseInterceptors()` on a guarded handler (two
 *   guards, one key); `IdempotencyModule.forRoot({ interceptor })` is how a subclass runs;
 * - leaves `@Sse()` routes of a guarded controller unguarded (a stream of events is no answer to
 *   replay, and `EventSource` cannot send a key), with a warning;
 * - puts a watcher in front of each guarded HTTP route's method (`watchRouteMethod`), so that the
 *   guard knows whether a failed call failed in the method itself (`saveStatuses`) or before it
 *   (and in front of a method a guarded controller inherits, on the controller: the guard goes on it);
 *   on routes that save statuses (the route's `saveStatuses`, else `options`'), Nest hands the
 *   watcher its run (`markMethodStart`);
 * - with a `documenter` (`@nestjs/swagger` installed), documents in OpenAPI the HTTP routes this
 *   module guards (`guardOptionsOf`), under its options.
 */
export function placeGuards(modules: ModulesContainer, options: ResolvedIdempotencyOptions, documenter?: RouteDocumenter): OnApplicationBootstrap {
  const logger = new Logger('IdempotencyModule');
  refuseAppInterceptors(modules);
  noteRoutedModules(modules);
  sayIfTwoGlobalModules(modules, logger);
  const names = new Map<string, Type>();
  const seen = new Set<Type>();
  for (const module of modules.values()) {
    for (const wrapper of module.controllers.values()) {
      const controller = wrapper.metatype as Type | null;
      if (!controller) continue;
      if (seen.has(controller)) continue;
      seen.add(controller);
      // One guard per handler, innermost: none at class level, whoever put it there.
      const classInterceptors = interceptorsOf(controller);
      if (classInterceptors.some(isGuard)) {
        Reflect.defineMetadata(INTERCEPTORS_METADATA, withoutGuard(classInterceptors), controller);
      }
      for (const { name: method, handler: declared, declaredOn } of controllerMethods(controller.prototype)) {
        const isHttpRoute = Reflect.hasMetadata(PATH_METADATA, declared);
        const isMessageHandler = Reflect.hasMetadata(PATTERN_METADATA, declared);
        const guarded = isHttpRoute || isMessageHandler ? guardedRouteMetadata(controller, declared) : undefined;
        // Documented by the module that guards it, with its options (see guardOptionsOf); with its @ContentDigest() answers.
        const documents = documenter && isHttpRoute && (guardOptionsOf(module, modules) ?? options) === options;
        const digest = isHttpRoute ? contentDigestOf(controller, declared) : undefined;
        if (!guarded) {
          if (documents && digest) documenter!.document(controller.prototype, method, undefined, options, digest);
          // The usual Nest idiom guarded nothing, in silence (an adversarial helper: 10 of 10 copies ran).
          // Not where a class-level @NoRepeatSubmit() leaves reads unguarded, nor a route skipped on purpose.
          const byHand = (item: unknown) => isGuardClass(item) && item !== NoRepeatSubmitInterceptor;
          const classGuarded = Reflect.getMetadata(NO_REPEAT_SUBMIT_METADATA, controller) !== undefined;
          const named = interceptorsOf(declared).find(byHand) ?? (classGuarded ? undefined : classInterceptors.find(byHand));
          if (named && (isHttpRoute || isMessageHandler) && !Reflect.getMetadata(SKIP_IDEMPOTENCY_METADATA, declared)) {
            logger.warn(
              `${controller.name}.${method} names ${(named as Type).name} in @UseInterceptors() but has no @NoRepeatSubmit(): ` +
                'it is not guarded. The guard runs where @NoRepeatSubmit() is (on the method or its controller), with no ' +
                '@UseInterceptors() of its own.',
            );
          }
          continue;
        }
        sayIfKeyReadsElsewhere(logger, `${controller.name}.${method}`, guarded, isHttpRoute, isMessageHandler);
        const subclass = [...classInterceptors, ...interceptorsOf(declared)].find(isGuardSubclass);
        if (subclass) {
          throw new IdempotencyConfigError(
            `${controller.name}.${method}: @UseInterceptors(${subclass.name}) on a @NoRepeatSubmit() route guards it twice (every call ` +
              `would find its own claim: 409). Give it as IdempotencyModule.forRoot({ interceptor: ${subclass.name} }): @NoRepeatSubmit() then runs it.`,
          );
        }
        if (Reflect.getMetadata(SSE_METADATA, declared)) {
          Reflect.defineMetadata(INTERCEPTORS_METADATA, withoutGuard(interceptorsOf(declared)), declared);
          logger.warn(`${controller.name}.${method} is an @Sse() route: @NoRepeatSubmit does not guard it`);
          continue;
        }
        // The function the router will call: for an HTTP route, a watcher in front of the method.
        // A method a base class shares with other controllers gets one on this controller, which
        // takes the guard: put on the base's, it went to every subclass, and an app holding only
        // an unguarded one, without IdempotencyModule, refused to start (an adversarial helper).
        const inherited = declaredOn !== controller.prototype;
        const handler = isHttpRoute || inherited ? watchRouteMethod(controller.prototype, method, declaredOn) : declared;
        const { saveStatuses } = guarded.options;
        if (isHttpRoute && (saveStatuses === undefined ? options.savesStatus : savesStatus(saveStatuses))) {
          markMethodStart(controller.prototype, method);
        }
        const others = withoutGuard(interceptorsOf(handler));
        Reflect.defineMetadata(INTERCEPTORS_METADATA, [...others, NoRepeatSubmitInterceptor], handler);
        if (documents) documenter!.document(controller.prototype, method, guarded, options, digest);
        const name = `${controller.name}.${method}`;
        const other = names.get(name);
        if (other && other !== controller) {
          throw new IdempotencyConfigError(
            `Two guarded handlers are named ${name} (two controller classes named ${controller.name}): their ` +
              'idempotency keys would share records, and one route would replay the other\'s answers. Rename one class.',
          );
        }
        names.set(name, controller);
      }
    }
  }
  // Once every mark is placed: an override reads its base method's parameters, mark included.
  for (const controller of seen) dropForeignMarks(controller, controllerMethods(controller.prototype));
  const refuseMadeOutsideControllers = refuseGuardsOutsideControllers(modules, seen);
  return {
    onApplicationBootstrap: () => {
      refuseMadeOutsideControllers();
      checkGlobalGuards(modules, logger);
    },
  };
}

type NestModule = ModulesContainer extends Map<string, infer M> ? M : never;

/**
 * The resolved options of the `IdempotencyModule` whose guard runs a controller of `module`, as
 * Nest's injector finds the guard for it (`lookupComponentInImports`): depth first through its
 * imports (its own `isGlobal: false` module's before the global ones Nest adds to every module's
 * imports), and on through the modules each import re-exports (a shared module that exports the
 * IdempotencyModule it imports: an adversarial helper). Undefined while that module's options are
 * not made yet (its own placement documents then).
 */
function guardOptionsOf(module: NestModule, modules: ModulesContainer): unknown {
  const serving = servingModule(module, false, new Set()) ?? [...modules.values()].find((candidate) => candidate.isGlobal && providesGuard(candidate));
  return serving?.providers.get(IDEMPOTENCY_RESOLVED_OPTIONS)?.instance ?? undefined;
}

const providesGuard = (module: NestModule) => module.providers.has(IdempotencyInterceptor) && module.exports.has(IdempotencyInterceptor);

function servingModule(module: NestModule, traversing: boolean, seen: Set<NestModule>): NestModule | undefined {
  for (const imported of module.imports) {
    if (!imported || seen.has(imported) || (traversing && !module.exports.has(imported.metatype as never))) continue;
    seen.add(imported);
    if (providesGuard(imported)) return imported;
    const found = servingModule(imported, true, seen);
    if (found) return found;
  }
  return undefined;
}

/** Apps already told they import two global IdempotencyModules (each module's placement runs). */
const toldTwoGlobals = new WeakSet<ModulesContainer>();

/**
 * Says so where an app imports two global `IdempotencyModule`s: every route takes the options and
 * store of one of them and the other's are never used, which nothing showed (an adversarial helper).
 */
function sayIfTwoGlobalModules(modules: ModulesContainer, logger: Logger): void {
  if (toldTwoGlobals.has(modules)) return;
  const globals = [...modules.values()].filter((module) => module.isGlobal && module.providers.has(IdempotencyInterceptor));
  if (globals.length < 2) return;
  toldTwoGlobals.add(modules);
  logger.warn(
    `The app imports ${globals.length} global IdempotencyModules: every guarded route uses the options and store of one of them, ` +
      'and the others are not used. Import one with forRoot() / forRootAsync(); a feature module that needs other options imports ' +
      'its own with isGlobal: false.',
  );
}

/**
 * Refuses `@NoRepeatSubmit()` on a class that is no controller: a GraphQL resolver, a WebSocket
 * gateway, a service. The guard keys HTTP requests and messages only, so every call of such a
 * method ran unguarded (or never met the guard at all), said only at the first call, if ever.
 * A provider given as a value is checked now, by its class; one made by a factory shows its class
 * once made: returns the check of those, for the app's bootstrap (a resolver given so ran
 * unguarded, in silence: an adversarial helper, 50 runs of 50 copies of one mutation). A
 * request-scoped or transient one is made per call, and not seen.
 */
function refuseGuardsOutsideControllers(modules: ModulesContainer, controllers: ReadonlySet<Type>): () => void {
  const made: { readonly instance: unknown }[] = [];
  for (const module of modules.values()) {
    for (const wrapper of module.providers.values()) {
      const type = wrapper.metatype as Type | null;
      if (typeof type === 'function' && !wrapper.inject && type.prototype) {
        if (!controllers.has(type)) refuseIfGuarded(type);
      } else if (wrapper.isDependencyTreeStatic() && !wrapper.isTransient) {
        // A factory provider's metatype is its factory function, not a class of the app's; a value's is null.
        if (wrapper.instance !== undefined && wrapper.instance !== null) refuseIfMadeOfGuarded(wrapper.instance, controllers);
        else made.push(wrapper);
      }
    }
  }
  return () => {
    for (const wrapper of made) refuseIfMadeOfGuarded(wrapper.instance, controllers);
  };
}

/** Refuses an instance whose class has `@NoRepeatSubmit()` and is no controller. */
function refuseIfMadeOfGuarded(instance: unknown, controllers: ReadonlySet<Type>): void {
  if (typeof instance !== 'object' || instance === null) return;
  let type: unknown;
  try {
    type = (instance as { constructor?: unknown }).constructor;
  } catch {
    return; // a strict proxy (an env object) that allows only the names it knows
  }
  if (typeof type === 'function' && type !== Object && type.prototype && !controllers.has(type as Type)) refuseIfGuarded(type as Type);
}

function refuseIfGuarded(type: Type): void {
  const where = Reflect.getMetadata(NO_REPEAT_SUBMIT_METADATA, type)
    ? type.name
    : controllerMethods(type.prototype as object)
        .filter(({ handler }) => Reflect.getMetadata(NO_REPEAT_SUBMIT_METADATA, handler))
        .map(({ name }) => `${type.name}.${name}`)[0];
  if (!where) return;
  throw new IdempotencyConfigError(
    `${where}: @NoRepeatSubmit() guards the HTTP routes and message handlers of controllers, and ${type.name} is a ` +
      'provider (a GraphQL resolver, a WebSocket gateway, a service?): its calls would run unguarded. Guard the ' +
      'controller route that calls it, or use the storage layer (insertOnce, transition) in it.',
  );
}

/**
 * Warns at start-up of a key expression that reads where the handler's calls never carry a key:
 * an HTTP root (`#body`, `#headers`, ...) on a message handler, whose messages are `#data`, or
 * `#data` on an HTTP route. A class-level `@NoRepeatSubmit({ idempotentKey: '#body.orderNo' })`
 * over a controller with an `@EventPattern` refused every event as keyless, and each was dropped
 * (an adversarial helper); said only per call before.
 */
function sayIfKeyReadsElsewhere(
  logger: Logger,
  name: string,
  { key, options }: NoRepeatSubmitMetadata,
  isHttpRoute: boolean,
  isMessageHandler: boolean,
): void {
  // Keyed by its content (useRequestFingerprint), a message without a key is guarded (a reviewing helper).
  if ('header' in key && isMessageHandler && !options.useRequestFingerprint) {
    // A class-level @NoRepeatSubmit() guards every message handler: without a key expression each
    // read the key header, which no message carries, and every message was refused, every event
    // dropped, with no word at start-up (an adversarial helper: 20 of 20 events, on TCP).
    logger.warn(
      `${name} is a message handler keyed by the idempotency key header (no idempotentKey), which no message carries: every ` +
        'message is refused as keyless (and dropped, for an event; runs unguarded under required: false; is keyed by its content ' +
        "under useRequestFingerprint). Give it idempotentKey: '#data.<field>' (per method, when a class-level @NoRepeatSubmit " +
        'serves HTTP routes too), or @SkipIdempotency().',
    );
    return;
  }
  if (!('path' in key)) return;
  const { root, expression } = key.path;
  if (isMessageHandler && !isHttpRoute && root !== 'data') {
    logger.warn(
      `${name} is a message handler, and its key expression ${expression} reads ${describeKeyPath(key.path)} of an HTTP ` +
        'request: no message carries a key there, so every message is refused as keyless (runs unguarded under required: false; ' +
        'is keyed by its content under useRequestFingerprint). Read messages with #data (per method, ' +
        'when a class-level @NoRepeatSubmit serves HTTP routes too).',
    );
  } else if (isMessageHandler && isHttpRoute && root !== 'data') {
    logger.warn(
      `${name} is an HTTP route and a message handler, and its key expression ${expression} reads ${describeKeyPath(key.path)} ` +
        'of an HTTP request: no message carries a key there, so every message is refused as keyless (and dropped, for an event; ' +
        'runs unguarded under required: false). Give each its own method, the message handler keyed with #data.',
    );
  } else if (isHttpRoute && !isMessageHandler && root === 'data') {
    logger.warn(
      `${name} is an HTTP route, and its key expression ${expression} reads a message's data: no request carries a key there. ` +
        'Read requests with #body, #headers, #query, #params or #user.',
    );
  }
}

const refuseGlobal = (named: string, how: string) =>
  new IdempotencyConfigError(
    `${how} names ${named}, the guard of @NoRepeatSubmit(): every guarded call would be guarded twice (each guard finds ` +
      'the other\'s claim: 409 on every first request). Remove it: @NoRepeatSubmit() runs the module\'s guard, and a subclass is ' +
      `given as IdempotencyModule.forRoot({ interceptor${named === IdempotencyInterceptor.name ? '' : `: ${named}`} }).`,
  );

/**
 * Refuses the guard as an `APP_INTERCEPTOR` (`useClass`, `useExisting`, `useValue`), before the
 * app starts. Nest files each one under a token of its own, `APP_INTERCEPTOR (UUID: ...)`.
 */
function refuseAppInterceptors(modules: ModulesContainer): void {
  for (const module of modules.values()) {
    for (const [token, wrapper] of module.providers) {
      if (typeof token !== 'string' || !token.startsWith(`${APP_INTERCEPTOR} (`)) continue;
      const named = wrapper.isAlias ? wrapper.inject?.[0] : wrapper.inject ? undefined : (wrapper.metatype ?? wrapper.instance?.constructor);
      if (isGuardClass(named)) throw refuseGlobal(named.name, 'APP_INTERCEPTOR');
    }
  }
}

/**
 * Once the app is built, before it listens: refuses the guard among the app's global
 * interceptors however it got there (`app.useGlobalInterceptors()`, an `APP_INTERCEPTOR`
 * factory), and says when Nest builds the guard for each request (a subclass that injects a
 * request-scoped provider is request-scoped too).
 */
function checkGlobalGuards(modules: ModulesContainer, logger: Logger): void {
  // Nest's own: each module holds the container, which holds the app's configuration.
  const [first] = modules.values();
  const config = (first as unknown as { container?: { applicationConfig?: GlobalInterceptors } } | undefined)?.container?.applicationConfig;
  if (config) {
    const classes = [
      ...config.getGlobalInterceptors().map((interceptor): unknown => interceptor?.constructor),
      ...(config.getGlobalRequestInterceptors?.() ?? []).map((wrapper) => wrapper.metatype),
    ];
    const named = classes.find(isGuardClass);
    if (named) throw refuseGlobal(named.name, 'A global interceptor (app.useGlobalInterceptors() or APP_INTERCEPTOR)');
  }
  for (const module of modules.values()) {
    const guard = module.providers.get(IdempotencyInterceptor);
    if (!guard || guard.isDependencyTreeStatic()) continue;
    const name = (guard.metatype as Type | null)?.name ?? IdempotencyInterceptor.name;
    logger.warn(
      `${name} injects a request-scoped provider, so it is request-scoped too: Nest builds it (and NoRepeatSubmitInterceptor) for ` +
        `every request. The guard still keeps its route options and logs in the module, but fields of ${name} itself last one ` +
        'request. To build it once, inject singletons only and read what the request carries in getUser(ctx) / getKey(ctx).',
    );
  }
}

/** The `@ContentDigest()` options of a route, on its method or its controller; undefined without one. */
function contentDigestOf(controller: Type, method: object): ContentDigestOptions | undefined {
  return (Reflect.getMetadata(CONTENT_DIGEST_METADATA, method) ?? Reflect.getMetadata(CONTENT_DIGEST_METADATA, controller)) as ContentDigestOptions | undefined;
}
