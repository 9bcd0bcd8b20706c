import type { CallHandler } from '@nestjs/common';
import { AsyncLocalStorage } from 'node:async_hooks';
import type { Observable } from 'rxjs';

/** One guarded run: whether the route's method itself was called. */
interface WatchedRun {
  began: boolean;
}

const runs = new AsyncLocalStorage<WatchedRun>();
/** The methods `watchRouteMethod` put in place, so that a second app does not wrap them again. */
const watchers = new WeakSet<object>();

type Method = (this: unknown, ...args: unknown[]) => unknown;

/**
 * Puts, on the prototype that declares a guarded route's method, a method that calls it and
 * first tells the guarded run it is called from (if any) that the method began. Returns the
 * function now there: the handler Nest's router calls. Called at start-up, before the routes are
 * built; a method already put there is returned as it is.
 *
 * The new method carries everything the original had: every metadata key (`@Post()`,
 * `@HttpCode()`, `@NoRepeatSubmit()`, `@ApiResponse()`... the decorators set them on the
 * function), its `name`, its `length` and any other own property. Outside a guarded run that
 * watches (`watchHandler`) it only calls the original.
 */
export function watchRouteMethod(declaredOn: object, name: string): object {
  const original = (declaredOn as Record<string, unknown>)[name] as Method;
  if (watchers.has(original)) return original;
  const watcher = {
    [name](this: unknown, ...args: unknown[]): unknown {
      const run = runs.getStore();
      if (run) run.began = true;
      return original.apply(this, args);
    },
  }[name] as Method;
  Object.defineProperties(watcher, Object.getOwnPropertyDescriptors(original));
  for (const key of Reflect.getOwnMetadataKeys(original)) {
    Reflect.defineMetadata(key, Reflect.getOwnMetadata(key, original), watcher);
  }
  const descriptor = Object.getOwnPropertyDescriptor(declaredOn, name)!;
  Object.defineProperty(declaredOn, name, { ...descriptor, value: watcher });
  watchers.add(watcher);
  return watcher;
}

/** The handler's Observable, and whether the route's method itself has been called. */
export interface WatchedHandler {
  handled: Observable<unknown>;
  /**
   * True once the method was called: past the pipes (`ValidationPipe`), the parameter
   * decorators and every interceptor inside the guard. False while they run or after they failed.
   */
  began(): boolean;
}

/**
 * `next.handle()` inside a run the route's method (put in place by `watchRouteMethod`) reports
 * to. Nest binds the rest of the chain (pipes, then the method) to the async context in which
 * `handle()` is called, so the method sees this run whenever the chain is subscribed.
 */
export function watchHandler(next: CallHandler): WatchedHandler {
  const run: WatchedRun = { began: false };
  const handled = runs.run(run, () => next.handle());
  return { handled, began: () => run.began };
}
