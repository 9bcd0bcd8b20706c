import type { ExecutionContext } from '@nestjs/common';
import { leaseSignalOf } from '../decorators/lease-signal.decorator.js';
import { controllerMethods, type NoRepeatSubmitMetadata } from '../decorators/no-repeat-submit.metadata.js';
import { savesStatus, type ResolvedIdempotencyOptions, type SavesStatus } from '../idempotency.config.js';
import type { ErrorFormat } from '../errors/problem-details.js';
import type { FailMode } from '../idempotency.options.js';
import { describeKeyPath } from '../keys/key-expression.js';
import { ROUTE_ARGS_METADATA, takesStartMark } from './handler-start.js';
import { answersAtSeveralPaths, routeKeyPath, type RouteSite } from './route-paths.js';

/**
 * A decorated handler's settings: the decorator's options (method over controller) merged over
 * the module's, once per handler. Durations in milliseconds.
 */
export interface GuardedRoute {
  metadata: NoRepeatSubmitMetadata;
  /** `ControllerName.methodName`: the key's handler segment. */
  handler: string;
  /** An HTTP handler that answers at several paths: the matched one joins its handler segment, as this makes it (`route-paths`). */
  routeKeyPath: ((matched: string) => string) | undefined;
  /** How long a completed response is replayed (the store's `retentionMs`), from `expireSeconds`. */
  expireMs: number;
  /** How long a claim holds without renewal, from `leaseSeconds`. */
  leaseMs: number;
  /** The longest a running handler keeps its claim (renewed), from `maxHoldSeconds`; at least `leaseMs`. */
  maxHoldMs: number;
  /**
   * How long a duplicate waits for the first result, from `waitForResultMs`. An event nobody
   * settles (no `onSkippedMessage`) waits by default as long as the first may hold the key: its
   * transport acknowledges it either way, and dropped while the first ran, it was lost when the
   * first then failed.
   */
  waitForResultMs: number;
  /** `waitForResultMs` is that default (kept only where the store pushes settlements: see `ClaimAnswers`). */
  waitsByDefault: boolean;
  failMode: FailMode;
  /** How HTTP refusals are written: Nest's JSON or RFC 9457 problem details. */
  errorFormat: ErrorFormat;
  useFingerprint: boolean;
  ignoreFields: ReadonlySet<string>;
  /** Where a client puts the key, named in the 400 answer. */
  keySource: string;
  /** Largest response body kept for replay, in bytes. */
  maxResponseBytes: number;
  /** The handler sends its own answer (`@Res()` / `@Next()` without passthrough): Nest sends none. */
  sendsOwnResponse: boolean;
  /**
   * The handler has the response (`@Res()` / `@Next()`, passthrough or not), so it may answer
   * through it itself (a redirect): its `end()` while it runs is its answer.
   */
  holdsResponse: boolean;
  /** The handler is a `@Render()` route: Nest renders its value through the app's view engine. */
  renders: boolean;
  /** The handler has a `@LeaseSignal()` parameter: the guard hands it the claim's signal. */
  takesLeaseSignal: boolean;
  /** The request header that carries the key (lower case), for routes keyed by a header. */
  keyHeader: string;
  /** The request methods guarded, for a route a class-level decorator alone guards (else all but HEAD). */
  requestMethods: ReadonlySet<string> | undefined;
  /** A call without a key is refused (else it runs unguarded). */
  required: boolean;
  /**
   * Whether the 4xx answer to the handler's error, once the handler began, is saved (from
   * `saveStatuses`, the route's over the module's); undefined: every error releases the key.
   */
  savesStatus: SavesStatus | undefined;
  /** Nest hands the route's method watcher the request's run (`markMethodStart`): no AsyncLocalStorage to know it began. */
  takesStartMark: boolean;
  skipIf: ((ctx: ExecutionContext) => boolean) | undefined;
}

/** The route options of a handler the decorator guards (`metadata`: what it recorded there). */
export function routeOptions(
  metadata: NoRepeatSubmitMetadata,
  ctx: ExecutionContext,
  defaults: ResolvedIdempotencyOptions,
  site: RouteSite = {},
): GuardedRoute {
  const { options, key } = metadata;
  const method = methodName(ctx);
  const keyHeader = options.keyHeader ?? defaults.keyHeader;
  const leaseMs = Math.ceil((options.leaseSeconds ?? defaults.leaseSeconds) * 1000);
  const holds = holdsResponse(ctx, method);
  const maxHoldMs = Math.max(leaseMs, Math.ceil((options.maxHoldSeconds ?? defaults.maxHoldSeconds) * 1000));
  const waitsByDefault = options.waitForResultMs === undefined && isEventHandler(ctx.getHandler()) && !defaults.onSkippedMessage;
  return {
    metadata,
    handler: `${ctx.getClass().name}.${method}`,
    routeKeyPath: ctx.getType() === 'http' && answersAtSeveralPaths(ctx, site) ? routeKeyPath(ctx, site) : undefined,
    expireMs: Math.ceil((options.expireSeconds ?? defaults.expireSeconds) * 1000),
    leaseMs,
    maxHoldMs,
    waitForResultMs: options.waitForResultMs ?? (waitsByDefault ? maxHoldMs + leaseMs : 0),
    waitsByDefault,
    failMode: options.failMode ?? defaults.failMode,
    errorFormat: options.errorFormat ?? defaults.errorFormat,
    useFingerprint: options.useRequestFingerprint ?? false,
    ignoreFields: new Set([...defaults.ignoreFields, ...(options.ignoreFields ?? [])]),
    keySource: 'path' in key ? describeKeyPath(key.path) : 'header' in key ? `the ${keyHeader} header` : 'the request',
    keyHeader: keyHeader.toLowerCase(),
    maxResponseBytes: options.maxResponseBytes ?? defaults.maxResponseBytes,
    holdsResponse: holds,
    sendsOwnResponse: holds && !passthrough(ctx, method),
    renders: Reflect.getMetadata(RENDER_METADATA, ctx.getHandler()) !== undefined,
    takesLeaseSignal: takesLeaseSignal(ctx, method),
    required: options.required ?? defaults.required,
    savesStatus: options.saveStatuses === undefined ? defaults.savesStatus : savesStatus(options.saveStatuses),
    takesStartMark: ctx.getType() === 'http' && takesStartMark(ctx.getHandler()),
    skipIf: options.skipIf,
    requestMethods: metadata.requestMethods && new Set(metadata.requestMethods),
  };
}

/** `@nestjs/microservices` marks `@EventPattern` handlers with this (PatternHandler.EVENT). */
const HANDLER_TYPE_METADATA = 'microservices:handler_type';
const EVENT_HANDLER = 2;

/** Whether `handler` is an `@EventPattern` handler. */
export function isEventHandler(handler: object): boolean {
  return Reflect.getMetadata(HANDLER_TYPE_METADATA, handler) === EVENT_HANDLER;
}

/**
 * The handler's property name on its controller, as Nest's router knows it: the function's own
 * `name` is another when a method decorator wrapped it (often ''), which would give two handlers
 * one key segment.
 */
function methodName(ctx: ExecutionContext): string {
  const handler = ctx.getHandler();
  return controllerMethods(ctx.getClass().prototype).find((method) => method.handler === handler)?.name ?? handler.name;
}

/** `@nestjs/common`'s RENDER_METADATA, which `@Render()` sets on the handler (stable since Nest 5). */
const RENDER_METADATA = '__renderTemplate__';
/** `@nestjs/common`'s RouteParamtypes.RESPONSE / NEXT (stable since Nest 5). */
const RESPONSE_ARG = 1;
const NEXT_ARG = 2;

/** `@nestjs/common`'s RESPONSE_PASSTHROUGH_METADATA: set by `@Res({ passthrough: true })` on the method. */
const RESPONSE_PASSTHROUGH_METADATA = '__responsePassthrough__';

type RouteArgs = Record<string, { factory?: unknown }>;

/** The handler's parameters as Nest records them (the same metadata for HTTP and RPC handlers). */
function routeArgs(ctx: ExecutionContext, method: string): RouteArgs {
  return (Reflect.getMetadata(ROUTE_ARGS_METADATA, ctx.getClass(), method) as RouteArgs | undefined) ?? {};
}

/**
 * Whether a parameter is `@LeaseSignal()`, so that a route without one hands over no signal: the
 * hand-over is a property on the request, and on Express a property added to a request costs a
 * hidden class of its own (see `hookResponse`).
 */
function takesLeaseSignal(ctx: ExecutionContext, method: string): boolean {
  return Object.values(routeArgs(ctx, method)).some((arg) => arg.factory === leaseSignalOf);
}

/** Whether the handler takes the response: a `@Res()` or `@Next()` parameter. */
function holdsResponse(ctx: ExecutionContext, method: string): boolean {
  return Object.keys(routeArgs(ctx, method)).some((slot) => {
    const type = Number(slot.split(':')[0]);
    return type === RESPONSE_ARG || type === NEXT_ARG;
  });
}

/**
 * `@Res({ passthrough: true })`: Nest still sends the handler's value (its router's
 * `isResponseHandled`). The passthrough is metadata of the method, not of the parameter: read
 * from the parameter, every passthrough route was taken for one that sends its own answer, and a
 * replay went out before Nest sent the value.
 */
function passthrough(ctx: ExecutionContext, method: string): boolean {
  return Boolean(Reflect.getMetadata(RESPONSE_PASSTHROUGH_METADATA, ctx.getClass(), method));
}
