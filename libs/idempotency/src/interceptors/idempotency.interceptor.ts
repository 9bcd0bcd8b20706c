import {
  Inject,
  Injectable,
  Logger,
  type CallHandler,
  type ExecutionContext,
  type NestInterceptor,
} from '@nestjs/common';
import { HttpAdapterHost } from '@nestjs/core';
import { Observable, type Subscription } from 'rxjs';
import { rememberLeaseSignal } from '../decorators/lease-signal.decorator.js';
import { guardedRouteMetadata } from '../decorators/no-repeat-submit.metadata.js';
import { IdempotencyError, IdempotencyKeyError } from '../errors/idempotency.errors.js';
import { IDEMPOTENCY_RESOLVED_OPTIONS, type ResolvedIdempotencyOptions } from '../idempotency.config.js';
import { fingerprintRequest } from '../keys/fingerprint.js';
import { buildStorageKey, type KeyUser } from '../keys/storage-key.js';
import { IdempotencyCounters } from '../metrics/idempotency-counters.js';
import { IdempotencyStore, type ClaimInput, type ClaimResult } from '../stores/idempotency-store.js';
import { awaitSettled } from './await-settled.js';
import { readClientKey } from './client-key.js';
import type { GuardExchange, HeldClaim } from './exchange.js';
import { HttpExchange } from './http-exchange.js';
import type { HttpRequest, HttpResponse } from './http-request.js';
import { MESSAGE_USER, requestUser } from './key-user.js';
import { claimToken } from './claim-token.js';
import { routeOptions, type GuardedRoute } from './route-options.js';
import { RpcExchange } from './rpc-exchange.js';
import { StoreCalls } from './store-calls.js';

/** What answers a guarded call; `release` frees a claim it holds, unused. */
interface Guarded {
  result: Observable<unknown>;
  release?: () => Promise<void>;
}

/**
 * The guard behind `@NoRepeatSubmit()`: claims the key (one store round trip), runs the handler,
 * saves its answer (one more), and answers duplicates from the store. HTTP requests and RPC
 * messages alike. `getUser` and `getKey` may be overridden in a subclass.
 */
@Injectable()
export class IdempotencyInterceptor implements NestInterceptor {
  private readonly logger = new Logger('Idempotency');
  /** Per controller class, then handler: subclasses of one base share its handler functions. */
  private readonly routes = new WeakMap<object, WeakMap<object, GuardedRoute | null>>();
  /** Configuration problems already logged (once per handler and kind). */
  private readonly logged = new Set<string>();
  private readonly calls: StoreCalls;

  constructor(
    private readonly adapterHost: HttpAdapterHost,
    private readonly store: IdempotencyStore,
    private readonly counters: IdempotencyCounters,
    @Inject(IDEMPOTENCY_RESOLVED_OPTIONS) private readonly options: ResolvedIdempotencyOptions,
  ) {
    this.calls = new StoreCalls(store, counters, this.logger);
  }

  intercept(ctx: ExecutionContext, next: CallHandler): Observable<unknown> {
    const route = this.routeOf(ctx);
    if (!route || route.skipIf?.(ctx) || this.unguardedMethod(ctx, route)) return next.handle();
    // The claim happens once the caller subscribes, and a caller gone before the run starts (an
    // outer timeout during the claim) gets the key released: the handler never ran.
    return new Observable<unknown>((subscriber) => {
      let gone = false;
      let run: Subscription | undefined;
      this.guard(ctx, next, route).then(
        ({ result, release }) => {
          if (gone) void release?.();
          else run = result.subscribe(subscriber);
        },
        (error: unknown) => subscriber.error(error),
      );
      return () => {
        gone = true;
        run?.unsubscribe();
      };
    });
  }

  /** The decorator's metadata on this handler, as route options (once per controller and handler). */
  private routeOf(ctx: ExecutionContext): GuardedRoute | null {
    const handler = ctx.getHandler();
    const controller = ctx.getClass();
    let routes = this.routes.get(controller);
    if (!routes) this.routes.set(controller, (routes = new WeakMap()));
    let route = routes.get(handler);
    if (route === undefined) {
      const metadata = guardedRouteMetadata(controller, handler);
      route = metadata ? routeOptions(metadata, ctx, this.options) : null;
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
  private async guard(ctx: ExecutionContext, next: CallHandler, route: GuardedRoute): Promise<Guarded> {
    const exchange = await this.exchangeOf(ctx, route);
    if (!exchange) return { result: next.handle() };

    const user = this.userOf(ctx, route);
    if (!user) return { result: exchange.refuse({ reason: 'user_unresolved' }) };
    let clientKey: string | undefined;
    try {
      clientKey = this.getKey(ctx, route);
    } catch (error) {
      if (!(error instanceof IdempotencyKeyError)) throw error;
      return { result: exchange.refuse({ reason: 'key_invalid', problem: error.problem }) };
    }

    let fingerprint: string;
    try {
      fingerprint = fingerprintRequest(exchange.fingerprintInput(), route.ignoreFields);
    } catch (error) {
      if (!(error instanceof IdempotencyError)) throw error;
      return { result: exchange.refuse({ reason: 'payload_unsupported', problem: error.message }) };
    }

    // The client key, else the fingerprint stands in. Anonymous callers share one namespace, so
    // only a key they chose may key them.
    const keySegment = clientKey ?? (route.useFingerprint && !('anonymous' in user) ? fingerprint : undefined);
    if (keySegment === undefined) {
      return { result: route.required ? exchange.refuse({ reason: 'key_missing', source: route.keySource }) : next.handle() };
    }
    const storageKey = buildStorageKey({ prefix: this.options.keyPrefix, user, handler: route.handler, key: keySegment });
    return this.claim(ctx, exchange, next, route, { key: storageKey, token: claimToken(), fingerprint, leaseMs: route.leaseMs });
  }

  /** The call as its transport sees it; undefined for a transport the guard does not know. */
  private async exchangeOf(ctx: ExecutionContext, route: GuardedRoute): Promise<GuardExchange | undefined> {
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
        return RpcExchange.create(ctx, route);
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
    const user = requestUser(this.getUser(ctx), ctx.getArgByIndex<HttpRequest>(0), this.options.anonymous);
    if (user) return user;
    this.onceFor(`${route.handler}:user`, () =>
      this.logger.error(
        `${route.handler}: the request's user has no usable id (a non-empty string or a number; request.user.id, else .sub), ` +
          'so the guard cannot tell users apart and refuses the call (500). Give IdempotencyModule.forRoot({ getUser: (ctx) => ... }) for your user shape.',
      ),
    );
    return undefined;
  }

  /** The user segment of the key. Default: the module's `getUser` (`request.user.id`, else `.sub`). */
  protected getUser(ctx: ExecutionContext): string | number | undefined {
    return this.options.getUser(ctx);
  }

  /**
   * The client's key: the route's expression or function, else the key header (`keyHeader`,
   * default `Idempotency-Key`).
   * Returns undefined when the call has none; throws for a bad one, which the guard answers
   * 400 `IDEMPOTENCY_KEY_INVALID` (an RPC error with that code for a message).
   */
  protected getKey(ctx: ExecutionContext, config: GuardedRoute): string | undefined {
    return readClientKey(ctx, config);
  }

  /** Claims the storage key and answers by what the store holds: run, replay or refuse. */
  private async claim(
    ctx: ExecutionContext,
    exchange: GuardExchange,
    next: CallHandler,
    route: GuardedRoute,
    input: ClaimInput,
  ): Promise<Guarded> {
    let claim: ClaimResult;
    try {
      claim = await this.calls.timed('claim', () => this.store.claim(input));
      if (claim.status === 'in_progress' && route.waitForResultMs > 0) {
        this.counters.count('waited', route.handler);
        claim = await awaitSettled(this.store, input, claim, route.waitForResultMs, (error) => {
          this.counters.count('storeErrors', route.handler);
          this.logger.warn(`${route.handler}: cannot wait for the first result: ${(error as Error).message}`);
        });
      }
    } catch (error) {
      this.counters.count('storeErrors', route.handler);
      const message = `${route.handler}: idempotency store unavailable, ${(error as Error).message}`;
      if (route.failMode === 'closed') {
        this.logger.warn(`${message}; refusing`);
        return { result: exchange.refuse({ reason: 'store_unavailable' }) };
      }
      this.counters.count('failOpen', route.handler);
      this.logger.warn(`${message}; running unguarded`);
      // A claim that timed out may still land when the store recovers: run as its possible
      // holder, so that the answer completes it or a failure releases it, never a stranded key.
      return this.runHolding(ctx, exchange, next, this.calls.hold(input, route, true));
    }
    switch (claim.status) {
      case 'in_progress':
        this.counters.count('inProgress', route.handler);
        return { result: exchange.refuse({ reason: 'in_progress', retryAfterMs: claim.retryAfterMs }) };
      case 'mismatch':
        this.counters.count('mismatched', route.handler);
        return { result: exchange.refuse({ reason: 'key_reused' }) };
      case 'completed':
        this.counters.count('replayed', route.handler);
        return { result: exchange.replay(claim.response) };
      case 'acquired':
        this.counters.count('acquired', route.handler);
        return this.runHolding(ctx, exchange, next, this.calls.hold(input, route, false));
    }
  }

  private runHolding(ctx: ExecutionContext, exchange: GuardExchange, next: CallHandler, claim: HeldClaim): Guarded {
    rememberLeaseSignal(ctx, claim.signal);
    return { result: exchange.run(next, claim), release: claim.release };
  }

  private onceFor(what: string, log: () => void): void {
    if (this.logged.has(what)) return;
    this.logged.add(what);
    log();
  }
}
