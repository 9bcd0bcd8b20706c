import {
  Inject,
  Injectable,
  Logger,
  Optional,
  type CallHandler,
  type ExecutionContext,
  type NestInterceptor,
} from '@nestjs/common';
import { HttpAdapterHost } from '@nestjs/core';
import { performance } from 'node:perf_hooks';
import { Observable, type Subscription } from 'rxjs';
import { guardedRouteMetadata } from '../decorators/no-repeat-submit.metadata.js';
import { IdempotencyConfigError, IdempotencyError, IdempotencyKeyError } from '../errors/idempotency.errors.js';
import { CallEvents } from '../events/call-events.js';
import type { IdempotencyTransport } from '../events/idempotency-event.js';
import { IdempotencyEvents } from '../events/idempotency-events.js';
import { IDEMPOTENCY_RESOLVED_OPTIONS, type ResolvedIdempotencyOptions } from '../idempotency.config.js';
import type { IdempotencyUserId } from '../idempotency.options.js';
import { fingerprintRequest, UnmatchableBodyError, unmatchableFingerprint } from '../keys/fingerprint.js';
import { buildStorageKey, type KeyUser } from '../keys/storage-key.js';
import { DeliveryPart } from '../messages/rmq-delivery.js';
import { IdempotencyCounters } from '../metrics/idempotency-counters.js';
import { IdempotencyStore } from '../stores/idempotency-store.js';
import { ClaimAnswers, type Guarded } from './claim-answer.js';
import { answersLater, checkedKey, readClientKey } from './client-key.js';
import { StoreCalls } from './store-calls.js';
import type { GuardExchange } from './exchange.js';
import { HttpExchange } from './http-exchange.js';
import type { HttpRequest, HttpResponse } from './http-request.js';
import { MESSAGE_USER, requestUser } from './key-user.js';
import { claimToken } from './claim-token.js';
import { GuardMemory } from './guard-memory.js';
import { isEventHandler, routeOptions, type GuardedRoute } from './route-options.js';
import { matchedRoutePath } from './route-paths.js';
import { RpcExchange } from './rpc-exchange.js';

/**
 * The guard behind `@NoRepeatSubmit()`: claims the key (one store round trip), runs the handler,
 * saves its answer (one more), and answers duplicates from the store. HTTP requests and RPC
 * messages alike. `getUser` and `getKey` may be overridden in a subclass: give it to the module
 * as `IdempotencyModule.forRoot({ interceptor })`, never to `@UseInterceptors()`; Nest builds it
 * there once (for every request if it injects a request-scoped provider), and `@NoRepeatSubmit()`
 * runs it (see `NoRepeatSubmitInterceptor`). A subclass takes its own providers as properties
 * (`@Inject(Users) private readonly users!: Users`): this constructor's parameters are internal.
 */
@Injectable()
export class IdempotencyInterceptor implements NestInterceptor {
  private readonly logger = new Logger('Idempotency');
  private readonly answers: ClaimAnswers;
  // Optional, so that a guard named where no IdempotencyModule is (APP_INTERCEPTOR,
  // @UseInterceptors()) is told what to do, not Nest's "can't resolve dependencies ... at index [1]".
  constructor(
    private readonly adapterHost: HttpAdapterHost,
    @Optional() store: IdempotencyStore,
    @Optional() counters: IdempotencyCounters,
    @Optional() @Inject(IDEMPOTENCY_RESOLVED_OPTIONS) private readonly options: ResolvedIdempotencyOptions,
    @Optional() private readonly events: IdempotencyEvents,
    /** Each route's options and what was logged once: the module's, however often Nest builds the guard. */
    @Optional() private readonly memory: GuardMemory,
  ) {
    if (!store || !counters || !options || !events || !memory) {
      throw new IdempotencyConfigError(
        `${new.target.name} is built where no IdempotencyModule is: import IdempotencyModule.forRoot({...}) (or forRootAsync) in the ` +
          'root module, and put @NoRepeatSubmit() on the routes to guard; do not name the guard in APP_INTERCEPTOR or @UseInterceptors()',
      );
    }
    const calls = memory.storeCalls(() => new StoreCalls(store, counters, this.logger, options.shutdownWaitSeconds));
    this.answers = new ClaimAnswers(store, counters, calls);
  }

  intercept(ctx: ExecutionContext, next: CallHandler): Observable<unknown> {
    const route = this.routeOf(ctx);
    if (!route || skips(route, ctx) || this.unguardedMethod(ctx, route)) return next.handle();
    // The claim happens once the caller subscribes, and a caller gone before the run starts (an
    // outer timeout during the claim) gets the key released: the handler never ran.
    return new Observable<unknown>((subscriber) => {
      let gone = false;
      let run: Subscription | undefined;
      const rpc = ctx.getType() === 'rpc';
      // A RabbitMQ delivery that other guarded handlers of its event may share (see DeliveryPart).
      const part = rpc ? DeliveryPart.join(ctx) : undefined;
      // The clock is read only when someone listens: with no listener, no event is ever built.
      this.guard(ctx, part ? part.watching(next) : next, route, this.events.listening ? performance.now() : undefined).then(
        ({ result, release }) => {
          if (!gone) run = result.subscribe(subscriber);
          // An event has no caller to leave: Nest runs its handlers under one forkJoin, which
          // unsubscribes the others when one fails, and taken for a caller gone, a guarded handler
          // beside an unguarded one that threw never ran and its message was never settled (an
          // adversarial helper: 0 of 20 ran). Its answer is made as if listened to.
          else if (rpc && isEventHandler(ctx.getHandler())) result.subscribe({ error: (error: unknown) => this.sayDetachedFailure(route, error) });
          else void release?.();
          part?.decided();
        },
        (error: unknown) => {
          part?.decided();
          subscriber.error(error);
        },
      );
      return () => {
        gone = true;
        run?.unsubscribe();
      };
    });
  }

  /** An event handler that failed after Nest stopped listening to it (another handler of its event threw): said once per handler. */
  private sayDetachedFailure(route: GuardedRoute, error: unknown): void {
    this.onceFor(`${route.handler}:detached`, () =>
      this.logger.warn(
        `${route.handler}: an event handler failed after Nest stopped listening to it (another handler of the event threw first): ` +
          `${(error as Error)?.message ?? String(error)}; said once per handler`,
      ),
    );
  }

  /** The decorator's metadata on this handler, as route options (once per controller and handler). */
  private routeOf(ctx: ExecutionContext): GuardedRoute | null {
    const handler = ctx.getHandler();
    const controller = ctx.getClass();
    const routes = this.memory.routesOf(controller);
    let route = routes.get(handler);
    if (route === undefined) {
      const metadata = guardedRouteMetadata(controller, handler);
      route = metadata ? routeOptions(metadata, ctx, this.options, this.memory.site) : null;
      routes.set(handler, route);
    }
    return route;
  }

  /**
   * A HEAD request (a read the router sends to a GET route) never takes a key; an `@All()` route a
   * class-level decorator guards is guarded only for the request methods it names.
   */
  private unguardedMethod(ctx: ExecutionContext, route: GuardedRoute): boolean {
    if (ctx.getType() !== 'http') return false;
    const method = ctx.getArgByIndex<HttpRequest>(0).method;
    return method === 'HEAD' || (route.requestMethods !== undefined && !route.requestMethods.has(method));
  }

  /**
   * The request path after the route options: the transport's exchange, the user and the client
   * key, the fingerprint, the storage key; then the store. A step that cannot go on refuses the
   * call, and the exchange answers the refusal its transport's way.
   */
  private async guard(ctx: ExecutionContext, next: CallHandler, route: GuardedRoute, startedAt: number | undefined): Promise<Guarded> {
    // Awaited only when a promise: each await is a turn of the microtask queue on every request.
    const found = this.exchangeOf(ctx, route);
    const exchange = isThenable(found) ? await found : found;
    if (!exchange) return { result: next.handle() };

    const user = this.userOf(ctx, route);
    if (!user) return { result: exchange.refuse({ reason: 'user_unresolved' }) };
    let clientKey: string | undefined;
    try {
      clientKey = this.getKey(ctx, route);
      // A subclass's getKey reads what the client sent: checked as a key function's value is.
      // Looked up per call: a subclass may define it as a class field, set after this class's constructor.
      if (this.getKey !== IdempotencyInterceptor.prototype.getKey) clientKey = checkedKey(clientKey, route, () => `${this.constructor.name}.getKey()`);
    } catch (error) {
      if (!(error instanceof IdempotencyKeyError)) throw error;
      return { result: exchange.refuse({ reason: 'key_invalid', problem: error.problem }) };
    }

    // The client key, else the fingerprint stands in. Anonymous callers share one namespace, so
    // only a key they chose may key them. A call with neither makes no claim: nothing to fingerprint.
    if (clientKey === undefined && (!route.useFingerprint || 'anonymous' in user)) {
      this.sayIfNoSuchParam(ctx, route);
      return { result: route.required ? exchange.refuse({ reason: 'key_missing', source: route.keySource }) : next.handle() };
    }
    let fingerprint: string;
    try {
      const source = exchange.fingerprintInput();
      fingerprint = fingerprintRequest(isThenable(source) ? await source : source, route.ignoreFields);
    } catch (error) {
      if (!(error instanceof IdempotencyError)) throw error;
      if (!(error instanceof UnmatchableBodyError) || clientKey === undefined) {
        return { result: exchange.refuse({ reason: 'payload_unsupported', problem: error.message }) };
      }
      // Its bytes are lost: under the client's key it runs once, and matches no other call (see UNMATCHABLE_RETRY).
      fingerprint = unmatchableFingerprint(claimToken());
    }
    const handler = exchange.keyHandler?.() ?? route.handler;
    const storageKey = buildStorageKey({ prefix: this.options.keyPrefix, user, handler, key: clientKey ?? { fingerprint } });
    const input = { key: storageKey, token: claimToken(), fingerprint, leaseMs: route.leaseMs };
    const events =
      startedAt === undefined
        ? undefined
        : new CallEvents(this.events, route.handler, ctx.getType<IdempotencyTransport>(), storageKey, startedAt);
    return this.answers.answer(ctx, exchange, next, route, input, events);
  }

  /**
   * A `#params.x` key expression on a route whose path has no `:x` (a typo, a renamed parameter)
   * can never find a key: every call is refused 400, or runs unguarded where a key is not
   * required, which nothing else would say. Said once per handler, on the first call without a
   * key (the path, with its global prefix and RouterModule parameters, is the request's).
   */
  private sayIfNoSuchParam(ctx: ExecutionContext, route: GuardedRoute): void {
    const source = route.metadata.key;
    if (!('path' in source) || source.path.root !== 'params' || ctx.getType() !== 'http') return;
    const name = source.path.segments[0]!;
    const req = ctx.getArgByIndex<HttpRequest>(0);
    const params = req.params as Record<string, unknown> | undefined;
    if (params !== null && typeof params === 'object' && Object.hasOwn(params, name)) return;
    // An optional parameter the call left out (Fastify leaves it out of `params`).
    const path = matchedRoutePath(req);
    if (path === undefined || new RegExp(`:${name.replace(/[.*+?^${}()|[\]\\]/g, '\\$&')}(?![$\\p{ID_Continue}])`, 'u').test(path)) return;
    this.onceFor(`${route.handler}:params`, () =>
      this.logger.error(
        `${route.handler}: its key expression #params.${source.path.segments.join('.')} names no parameter of the route's path ` +
          `(${path}), so no call has a key: ` +
          (route.required ? 'every call is refused 400 IDEMPOTENCY_KEY_MISSING' : 'every call runs unguarded (required: false)'),
      ),
    );
  }

  /** The call as its transport sees it; undefined for a transport the guard does not know. */
  private exchangeOf(ctx: ExecutionContext, route: GuardedRoute): GuardExchange | undefined | Promise<GuardExchange | undefined> {
    switch (ctx.getType()) {
      case 'http': {
        // The request and response by index: switchToHttp() adds three new closures to the
        // context on every call.
        // A request subscribed again (an outer retry()) is guarded again: its claim finds the
        // first run's, so it never runs the handler unguarded.
        const req = ctx.getArgByIndex<HttpRequest>(0);
        const res = ctx.getArgByIndex<HttpResponse>(1);
        return HttpExchange.create(req, res, route, this.adapterHost.httpAdapter, this.options.replayHeaders);
      }
      case 'rpc':
        return RpcExchange.create(ctx, route, this.memory, this.options.onSkippedMessage);
      default:
        // GraphQL, WebSockets: not guarded; said once per handler rather than silently.
        this.onceFor(`${route.handler}:${ctx.getType()}`, () =>
          this.logger.warn(`${route.handler}: @NoRepeatSubmit guards HTTP and RPC calls only; this ${ctx.getType()} call runs unguarded`),
        );
        return undefined;
    }
  }

  /**
   * Whose record it is: the user's id; an authenticated request without one is refused (never
   * keyed by address, which many users can share), said once per handler; an anonymous one
   * follows `anonymous`. Messages have no user.
   */
  private userOf(ctx: ExecutionContext, route: GuardedRoute): KeyUser | undefined {
    if (ctx.getType() === 'rpc') return MESSAGE_USER;
    const req = ctx.getArgByIndex<HttpRequest>(0);
    // A subclass's own getUser may write its id from several fields, as the module's may.
    const reading = this.getUser === IdempotencyInterceptor.prototype.getUser ? this.options.userIdReading : 'template';
    const user = requestUser(this.getUser(ctx), req, this.options.anonymous, this.options.userLocation.properties, reading);
    if (user && ('ip' in user || 'anonymous' in user)) {
      const credentials = req.headers.authorization !== undefined ? 'an Authorization header' : hasSession(req) ? 'a session' : undefined;
      if (credentials) {
        this.onceFor(`${route.handler}:credentials`, () =>
          this.logger.warn(
            `${route.handler}: a call with ${credentials} is keyed as anonymous: the guard found no user ` +
              '(request.user, or request.raw.user on Fastify), so every anonymous caller shares its keys. If the route ' +
              'authenticates its callers elsewhere (a property a guard sets for itself, request.auth, request.session), give ' +
              'the module a getUser option (forRoot or forRootAsync).',
          ),
        );
      }
    }
    if (user && 'anonymous' in user && this.options.anonymous === 'address') {
      this.onceFor(`${route.handler}:address`, () =>
        this.logger.warn(
          `${route.handler}: anonymous is 'address', but a call came with no client address (request.ip is empty or no IP ` +
            "address: a unix socket, a proxy's X-Forwarded-For: unknown); such calls are keyed as under 'client-key': only a key " +
            'the caller sends keys them.',
        ),
      );
    }
    if (user) return user;
    // Said of the getUser that read it: the default one reads request.user.id, else .sub.
    const whose =
      reading === 'field'
        ? "the request's user has no usable id (request.user.id, else .sub"
        : 'getUser gave no usable id (the module\'s getUser option, or a subclass\'s getUser';
    const fix =
      reading === 'field'
        ? 'Give the module a getUser option, (ctx) => ..., in forRoot or forRootAsync, for your user shape'
        : 'Make getUser return the id of every authenticated caller';
    this.onceFor(`${route.handler}:user`, () =>
      this.logger.error(
        `${route.handler}: ${whose}: a non-empty string or a number, never what a template over a missing field writes: ` +
          'undefined, null, NaN, [object Object], an empty part), so the guard cannot tell users apart and refuses the call (500). ' +
          `${fix} (the parts of a user known by several, e.g. [user.tenantId, user.sub], are checked one by one).`,
      ),
    );
    return undefined;
  }

  /** The user segment of the key. Default: the module's `getUser` (`request.user.id`, else `.sub`). */
  protected getUser(ctx: ExecutionContext): IdempotencyUserId | undefined {
    return this.options.getUser(ctx);
  }

  /**
   * The client's key: the route's expression or function, else the key header (`keyHeader`,
   * default `Idempotency-Key`).
   * Returns undefined when the call has none; throws for a bad one, which the guard answers
   * 400 `IDEMPOTENCY_KEY_INVALID` (an RPC error with that code for a message).
   */
  protected getKey(ctx: ExecutionContext, config: GuardedRoute): string | undefined {
    return readClientKey(ctx, config, this.options.userLocation.properties);
  }

  private onceFor(what: string, log: () => void): void {
    this.memory.onceFor(what, log);
  }
}

/**
 * A promise, or any thenable: tested by its `then`, not by `instanceof Promise` (an app that
 * replaces the global `Promise`, e.g. with Bluebird, would make an async function's native
 * promise fail that test).
 */
function isThenable<T>(value: T | PromiseLike<T>): value is PromiseLike<T> {
  return typeof (value as { then?: unknown } | undefined)?.then === 'function';
}

/** A session a session middleware or plugin attached (express-session, @fastify/session): it may be who the caller is. */
function hasSession(req: HttpRequest): boolean {
  const session = (req as { session?: unknown }).session;
  return typeof session === 'object' && session !== null;
}

/**
 * Whether `skipIf` says this call runs unguarded. A promise or an Observable is the developer's
 * mistake, said loudly (a 500 Nest logs), as for a key function: always truthy, an async
 * `skipIf` left every call unguarded, in silence (an adversarial helper: 11 runs of one key).
 */
function skips(route: GuardedRoute, ctx: ExecutionContext): boolean {
  if (!route.skipIf) return false;
  const answer = route.skipIf(ctx) as unknown;
  if (answersLater(answer)) {
    throw new TypeError(`${route.handler}: skipIf returned a promise or an Observable; it must return true or false itself`);
  }
  return Boolean(answer);
}
