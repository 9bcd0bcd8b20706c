import { Logger, type Type } from '@nestjs/common';
import type { ModulesContainer } from '@nestjs/core';
import { IdempotencyConfigError } from '../errors/idempotency.errors.js';
import { controllerMethods, guardedRouteMetadata } from '../decorators/no-repeat-submit.metadata.js';
import { watchRouteMethod } from './handler-start.js';
import { IdempotencyInterceptor } from './idempotency.interceptor.js';

/** Metadata keys of `@nestjs/common` and `@nestjs/microservices` (stable across Nest 10-12). */
const INTERCEPTORS_METADATA = '__interceptors__';
const PATH_METADATA = 'path';
const PATTERN_METADATA = 'microservices:pattern';
const SSE_METADATA = '__sse__';

type Interceptors = unknown[];
const interceptorsOf = (target: object): Interceptors => Reflect.getMetadata(INTERCEPTORS_METADATA, target) ?? [];
const withoutGuard = (list: Interceptors) => list.filter((item) => item !== IdempotencyInterceptor);

/**
 * Puts the guard where it sees the handler itself: last (innermost) among each guarded handler's
 * interceptors. Nest runs class-level interceptors outside method-level ones, and a method's in
 * the order their decorators apply (bottom-up), so a `@UseInterceptors(Timeout)` under a
 * class-level `@NoRepeatSubmit`, or written above the method's, would run inside the guard: its
 * 408 would look like the handler failing, and free the key while the handler still runs.
 * Also, once per app, before the routes are built:
 * - refuses two guarded handlers of different classes with one `Controller.method` name (their
 *   keys would share records: one route would replay the other's answers);
 * - leaves `@Sse()` routes of a guarded controller unguarded (a stream of events is no answer to
 *   replay, and `EventSource` cannot send a key), with a warning;
 * - puts a watcher in front of each guarded HTTP route's method (`watchRouteMethod`), so that the
 *   guard knows whether a failed call failed in the method itself (`saveStatuses`) or before it.
 */
export function placeGuards(modules: ModulesContainer): void {
  const logger = new Logger('IdempotencyModule');
  const names = new Map<string, Type>();
  const seen = new Set<Type>();
  for (const module of modules.values()) {
    for (const wrapper of module.controllers.values()) {
      const controller = wrapper.metatype as Type | null;
      if (!controller || seen.has(controller)) continue;
      seen.add(controller);
      // One guard per handler, innermost: none at class level, whoever put it there.
      const classInterceptors = interceptorsOf(controller);
      if (classInterceptors.includes(IdempotencyInterceptor)) {
        Reflect.defineMetadata(INTERCEPTORS_METADATA, withoutGuard(classInterceptors), controller);
      }
      for (const { name: method, handler: declared, declaredOn } of controllerMethods(controller.prototype)) {
        const isHttpRoute = Reflect.hasMetadata(PATH_METADATA, declared);
        const isRoute = isHttpRoute || Reflect.hasMetadata(PATTERN_METADATA, declared);
        if (!isRoute || !guardedRouteMetadata(controller, declared)) continue;
        // A handler a base class shares with other controllers gets the guard for all of them;
        // the guard resolves each (controller, handler) on its own, so an unguarded one passes.
        if (Reflect.getMetadata(SSE_METADATA, declared)) {
          Reflect.defineMetadata(INTERCEPTORS_METADATA, withoutGuard(interceptorsOf(declared)), declared);
          logger.warn(`${controller.name}.${method} is an @Sse() route: @NoRepeatSubmit does not guard it`);
          continue;
        }
        // The function the router will call: for an HTTP route, a watcher in front of the method.
        const handler = isHttpRoute ? watchRouteMethod(declaredOn, method) : declared;
        const others = withoutGuard(interceptorsOf(handler));
        Reflect.defineMetadata(INTERCEPTORS_METADATA, [...others, IdempotencyInterceptor], handler);
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
}
