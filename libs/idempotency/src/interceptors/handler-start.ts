import { Req, type CallHandler } from '@nestjs/common';
import { PARAMTYPES_METADATA } from '@nestjs/common/constants.js';
import { AsyncLocalStorage } from 'node:async_hooks';
import type { Observable } from 'rxjs';

/** One guarded run: whether the route's method itself was called. */
class WatchedRun {
  began = false;
}

/** `@nestjs/common`'s ROUTE_ARGS_METADATA: a handler's parameters, for HTTP and RPC (stable since Nest 5). */
export const ROUTE_ARGS_METADATA = '__routeArguments__';

/**
 * The run of each request whose method takes the start mark (`markMethodStart`), on the request
 * under a symbol: WeakMap entries outlive young-generation collections (see `lease-signal`). A
 * request that cannot take a property (frozen) falls back to the WeakMap.
 */
const RUN = Symbol('nestjs-idempotency.run');
const sealedRuns = new WeakMap<object, WatchedRun>();
type WithRun = { [RUN]?: WatchedRun };

const runOf = (req: object): WatchedRun | undefined => (Object.isExtensible(req) ? (req as WithRun)[RUN] : sealedRuns.get(req));

/**
 * Whether the start mark's argument is what Nest hands it, the request (Express's, Fastify's,
 * light-my-request's for `app.inject()`: each has a method, headers and a socket or the raw
 * request), rather than an argument of a caller's own (a test calling the method directly).
 */
function isRequest(value: unknown): value is object {
  if (typeof value !== 'object' || value === null) return false;
  if (runOf(value)) return true;
  const { method, headers } = value as { method?: unknown; headers?: unknown };
  return typeof method === 'string' && typeof headers === 'object' && headers !== null && ('socket' in value || 'raw' in value);
}

/** `@nestjs/microservices`' PATTERN_METADATA: the method is a message handler too. */
const PATTERN_METADATA = 'microservices:pattern';

/**
 * Runs a method without the start mark reports to, in an AsyncLocalStorage. Only for a route that
 * saves statuses at run time and took no mark at start-up: on Node 20 an AsyncLocalStorage once
 * run turns on async hooks for the whole process, and every request of the app then costs ~15 µs
 * more of CPU (a fifth of a bare Fastify request).
 */
const runs = new AsyncLocalStorage<WatchedRun>();

/**
 * Each watcher `watchRouteMethod` put in place: its start mark's entry and index (-1: none), and
 * how many arguments Nest gives the method itself (its own parameters').
 */
interface Slot {
  /** The method it calls. */
  original: Method;
  mark?: object;
  markAt: number;
  own: number;
}
const watchers = new WeakMap<object, Slot>();
/**
 * The start marks' entries in Nest's parameter metadata. Nest copies a class's entries by
 * reference into a subclass's when it adds parameters there, and a subclass that declares none
 * of its own reads its base class's: each mark is told by its entry.
 */
const markEntries = new WeakSet<object>();
type RouteArgs = Record<string, { index: number }>;

type Method = (this: unknown, ...args: unknown[]) => unknown;

/**
 * Puts, on `on` (a guarded controller's prototype, or the base class's that declares the method),
 * a method that calls `declaredOn[name]` and first tells the guarded run it is called from (if
 * any) that the method began. Returns the function now there: the handler Nest's router calls.
 * Called at start-up, before the routes are built; a method already put on `on` is returned as
 * it is. Put on a subclass, the base's method stays as it was for the classes that share it.
 *
 * The new method carries everything the original had: every metadata key (`@Post()`,
 * `@HttpCode()`, `@NoRepeatSubmit()`, `@ApiResponse()`... the decorators set them on the
 * function), its `name`, its `length` and any other own property. Outside a guarded run that
 * watches (`watchHandler`) it only calls the original.
 */
export function watchRouteMethod(on: object, name: string, declaredOn: object = on): object {
  const there = (declaredOn as Record<string, unknown>)[name] as Method;
  if (watchers.has(there) && on === declaredOn) return there;
  // A base class's watcher (its own route, or another app's): the subclass's watches its method.
  const original = watchers.get(there)?.original ?? there;
  const slot: Slot = { original, markAt: -1, own: 0 };
  const watcher = {
    [name](this: unknown, ...args: unknown[]): unknown {
      const at = slot.markAt;
      if (at >= 0 && args.length === at + 1 && isRequest(args[at])) {
        const marked = runOf(args[at] as object);
        if (marked) marked.began = true;
        args.length = slot.own;
      }
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
  Object.defineProperty(on, name, { ...descriptor, value: watcher });
  watchers.set(watcher, slot);
  if (on !== declaredOn) pinParameters(on, name);
  return watcher;
}

/**
 * Gives `on`'s class parameters of its own for `name`, as it reads them now without start marks:
 * a start mark put later on its base class (another app's route that saves statuses) is then not
 * read by this class, whose watcher does not take it off. Nest builds a request-scoped route's
 * parameters at its first request, after every app started (an adversarial helper: the method got
 * the request as one argument more).
 */
function pinParameters(on: object, name: string): void {
  const target = (on as { constructor: object }).constructor;
  if (Reflect.hasOwnMetadata(ROUTE_ARGS_METADATA, target, name)) return;
  const entries = (Reflect.getMetadata(ROUTE_ARGS_METADATA, target, name) ?? {}) as RouteArgs;
  Reflect.defineMetadata(ROUTE_ARGS_METADATA, withoutMarks(entries), target, name);
}

/**
 * Gives the watcher of `declaredOn[name]` (put there by `watchRouteMethod`) a parameter of its
 * own after the method's: Nest's own `@Req()`, which no pipe sees (Nest pipes only the body,
 * query, params, files and custom parameters; a custom one, which every global pipe saw, was
 * validated against a default parameter's class, copied, or refused by a strict pipe: an
 * adversarial helper). Nest hands it the request as it calls the method, after the guards,
 * interceptors and pipes, so the method itself began: the watcher tells the request's run
 * (`watchHandler`) and takes the argument off, so the method gets the arguments Nest gives it
 * without the mark. Its index is past every parameter the method declares (a default one
 * without a decorator, typed by a class, included). Once per method; for routes that save
 * statuses. A call of its own with more arguments than the method declares, the last one a
 * request, loses the last ones as Nest's would.
 */
export function markMethodStart(declaredOn: object, name: string): void {
  const method = (declaredOn as Record<string, unknown>)[name] as Method;
  const slot = watchers.get(method);
  if (!slot || slot.markAt >= 0) return;
  // A message handler too: Nest's RPC context reads the same parameters and hands an `@Req()` null
  // (an adversarial helper: the RPC call got two arguments more). Such a route keeps the
  // AsyncLocalStorage (`watchHandler` without a request).
  if (Reflect.hasMetadata(PATTERN_METADATA, method)) return;
  const target = (declaredOn as { constructor: object }).constructor;
  const params = Object.values((Reflect.getMetadata(ROUTE_ARGS_METADATA, target, name) ?? {}) as RouteArgs).filter((param) => !markEntries.has(param));
  const own = Math.max(-1, ...params.map((param) => param.index)) + 1;
  const declared = (Reflect.getMetadata(PARAMTYPES_METADATA, declaredOn, name) as unknown[] | undefined)?.length ?? 0;
  const at = Math.max(own, declared, method.length);
  Req()(declaredOn, name, at);
  // The new entry is this method's mark; a base class's method's mark it read along is not.
  const entries = Reflect.getOwnMetadata(ROUTE_ARGS_METADATA, target, name) as RouteArgs;
  const mark = entries[`0:${at}`]!;
  markEntries.add(mark);
  Reflect.defineMetadata(ROUTE_ARGS_METADATA, withoutMarks(entries, mark), target, name);
  slot.mark = mark;
  slot.own = own;
  slot.markAt = at;
}

/** `entries` without the start marks other than `kept`. */
function withoutMarks(entries: RouteArgs, kept?: object): RouteArgs {
  return Object.fromEntries(Object.entries(entries).filter(([, entry]) => entry === kept || !markEntries.has(entry)));
}

/**
 * Takes from `controller`'s parameters the start marks of methods that are not the one it runs:
 * an override that declares no parameters of its own reads its base class's, the base method's
 * mark included, and got the request as an argument (a reviewer; guarded or not). Call once the
 * app's marks are placed.
 */
export function dropForeignMarks(controller: object, methods: readonly { name: string; handler: unknown }[]): void {
  for (const { name, handler } of methods) {
    const entries = Reflect.getMetadata(ROUTE_ARGS_METADATA, controller, name) as RouteArgs | undefined;
    if (!entries) continue;
    const own = watchers.get(handler as object)?.mark;
    if (!Object.values(entries).some((entry) => entry !== own && markEntries.has(entry))) continue;
    Reflect.defineMetadata(ROUTE_ARGS_METADATA, withoutMarks(entries, own), controller, name);
  }
}

/** Whether Nest hands this route's watcher its run (`markMethodStart`). */
export function takesStartMark(handler: object): boolean {
  return (watchers.get(handler)?.markAt ?? -1) >= 0;
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
 * `next.handle()`, and whether the route's method (put in place by `watchRouteMethod`) has been
 * called from it. With `req` (a method that takes the start mark), the run is put on the request
 * and Nest hands it to the method. Without, `next.handle()` runs inside an AsyncLocalStorage the
 * method reports to: Nest binds the rest of the chain (pipes, then the method) to the async
 * context in which `handle()` is called, so the method sees this run whenever the chain is
 * subscribed.
 */
export function watchHandler(next: CallHandler, req?: object): WatchedHandler {
  const run = new WatchedRun();
  if (req === undefined) return { handled: runs.run(run, () => next.handle()), began: () => run.began };
  // Not enumerable: a copy of the request (`{ ...req }`, a logger's serializer) takes none of it.
  if (Object.isExtensible(req)) Object.defineProperty(req, RUN, { value: run, writable: true, configurable: true });
  else sealedRuns.set(req, run);
  return { handled: next.handle(), began: () => run.began };
}
