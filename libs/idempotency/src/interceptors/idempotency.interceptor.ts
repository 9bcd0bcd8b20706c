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
import { guardedRouteMetadata } from '../decorators/no-repeat-submit.metadata.js';
import { keyInvalid, userUnresolved } from '../errors/idempotency-http.exceptions.js';
import { IDEMPOTENCY_RESOLVED_OPTIONS, type ResolvedIdempotencyOptions } from '../idempotency.config.js';
import { parseKeyHeader, validateKey } from '../keys/idempotency-key.js';
import { evaluateKeyPath } from '../keys/key-expression.js';
import { buildStorageKey, type KeyOwner } from '../keys/storage-key.js';
import { IdempotencyCounters } from '../metrics/idempotency-counters.js';
import { IdempotencyStore, type ClaimInput, type ClaimResult } from '../stores/idempotency-store.js';
import { awaitSettled } from './await-settled.js';
import type { GuardExchange, OwnedKey } from './guard-exchange.js';
import { route, type GuardedRoute } from './guarded-route.js';
import { HttpExchange, type HttpRequest, type HttpResponse } from './http-exchange.js';
import { ownerToken } from './owner-token.js';
import { StoreCalls } from './store-calls.js';
import { RpcExchange } from './rpc-exchange.js';

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
    const config = this.routeOf(ctx);
    if (!config || config.skipIf?.(ctx) || this.unguardedMethod(ctx, config)) return next.handle();
    // The claim happens once the caller subscribes, and a caller gone before the run starts (an
    // outer timeout during the claim) gets the key released: the handler never ran.
    return new Observable<unknown>((subscriber) => {
      let gone = false;
      let run: Subscription | undefined;
      this.guard(ctx, next, config).then(
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

  /** Claims the key and says what answers the call; `release` frees a key it holds, unused. */
  private async guard(
    ctx: ExecutionContext,
    next: CallHandler,
    config: GuardedRoute,
  ): Promise<{ result: Observable<unknown>; release?: () => Promise<void> }> {
    const exchange = await this.exchangeOf(ctx, config);
    if (!exchange) return { result: next.handle() };

    // Anonymous callers share one namespace, so only a key they chose may key them.
    const fingerprintKey = config.useFingerprint && !('anonymous' in exchange.owner) ? exchange.fingerprint : undefined;
    const clientKey = exchange.clientKey ?? fingerprintKey;
    if (clientKey === undefined) {
      return { result: config.required ? exchange.refuse({ reason: 'key_missing', source: config.keySource }) : next.handle() };
    }
    const key = buildStorageKey({ prefix: this.options.keyPrefix, user: exchange.owner, handler: config.handler, key: clientKey });
    const input: ClaimInput = { key, token: ownerToken(), fingerprint: exchange.fingerprint, leaseMs: config.leaseMs };

    let claim: ClaimResult;
    try {
      claim = await this.calls.timed('claim', () => this.store.claim(input));
      if (claim.status === 'in_progress' && config.waitForResultMs > 0) {
        this.counters.count('waited', config.handler);
        claim = await awaitSettled(this.store, input, claim, config.waitForResultMs, (error) => {
          this.counters.count('storeErrors', config.handler);
          this.logger.warn(`${config.handler}: cannot wait for the first result: ${(error as Error).message}`);
        });
      }
    } catch (error) {
      this.counters.count('storeErrors', config.handler);
      const message = `${config.handler}: idempotency store unavailable, ${(error as Error).message}`;
      if (config.failMode === 'closed') {
        this.logger.warn(`${message}; refusing`);
        return { result: exchange.refuse({ reason: 'store_unavailable' }) };
      }
      this.counters.count('failOpen', config.handler);
      this.logger.warn(`${message}; running unguarded`);
      // A claim that timed out may still land when the store recovers: run as its possible
      // owner, so that the answer completes it or a failure releases it, never a stranded key.
      return this.runAs(exchange, next, this.calls.own(input, config, true));
    }
    switch (claim.status) {
      case 'in_progress':
        this.counters.count('inProgress', config.handler);
        return { result: exchange.refuse({ reason: 'in_progress', retryAfterMs: claim.retryAfterMs }) };
      case 'mismatch':
        this.counters.count('mismatched', config.handler);
        return { result: exchange.refuse({ reason: 'key_reused' }) };
      case 'completed':
        this.counters.count('replayed', config.handler);
        return { result: exchange.replay(claim.response) };
      case 'acquired':
        this.counters.count('acquired', config.handler);
        return this.runAs(exchange, next, this.calls.own(input, config, false));
    }
  }

  private runAs(exchange: GuardExchange, next: CallHandler, owned: OwnedKey) {
    return { result: exchange.run(next, owned), release: owned.release };
  }

  /**
   * A HEAD request (a read the router sends to a GET route) never takes a key; an `@All()` route a
   * class-level decorator guards is guarded only for the request methods it names.
   */
  private unguardedMethod(ctx: ExecutionContext, config: GuardedRoute): boolean {
    if (ctx.getType() !== 'http') return false;
    const method = ctx.getArgByIndex<HttpRequest>(0).method;
    return method === 'HEAD' || (config.requestMethods !== undefined && !config.requestMethods.has(method));
  }

  /** The user segment of the key. Default: the module's `getUser` (`request.user.id`, else `.sub`). */
  protected getUser(ctx: ExecutionContext): string | number | undefined {
    return this.options.getUser(ctx);
  }

  /**
   * The client's key: the route's expression or function, else the key header (`keyHeader`,
   * default `Idempotency-Key`).
   * Returns undefined when the call has none; throws 400 `IDEMPOTENCY_KEY_INVALID` for a bad one.
   */
  protected getKey(ctx: ExecutionContext, config: GuardedRoute): string | undefined {
    const source = config.metadata.key;
    const req = ctx.getType() === 'http' ? ctx.getArgByIndex<HttpRequest>(0) : undefined;
    let key: string | undefined;
    if ('header' in source) {
      const parsed = parseKeyHeader(req?.headers[config.keyHeader]);
      if (parsed && 'invalid' in parsed) throw keyInvalid(parsed.invalid);
      key = parsed?.key;
    } else if ('resolve' in source) {
      key = source.resolve(ctx);
    } else {
      key = evaluateKeyPath(
        source.path,
        req
          ? { body: req.body, headers: req.headers, query: req.query, params: req.params, user: req.user }
          : { data: ctx.switchToRpc().getData() },
      );
    }
    if (key === undefined) return undefined;
    const reason = validateKey(key);
    if (reason) throw keyInvalid(reason);
    return key;
  }

  private async exchangeOf(ctx: ExecutionContext, config: GuardedRoute): Promise<GuardExchange | undefined> {
    switch (ctx.getType()) {
      case 'http': {
        // The request and response by index: switchToHttp() adds three new closures to the
        // context on every call.
        // A request subscribed again (an outer retry()) is guarded again: its claim finds the
        // first run's, so it never runs the handler unguarded.
        const req = ctx.getArgByIndex<HttpRequest>(0);
        const { httpAdapter } = this.adapterHost;
        const res = ctx.getArgByIndex<HttpResponse>(1);
        const owner = this.ownerOf(ctx, req, config);
        return new HttpExchange(req, res, config, httpAdapter, this.options.replayHeaders, owner, this.getKey(ctx, config));
      }
      case 'rpc':
        return RpcExchange.create(ctx, config, () => this.getKey(ctx, config));
      default:
        // GraphQL, WebSockets: not guarded; said once per handler rather than silently.
        this.onceFor(`${config.handler}:${ctx.getType()}`, () =>
          this.logger.warn(`${config.handler}: @NoRepeatSubmit guards HTTP and RPC calls only; this ${ctx.getType()} call runs unguarded`),
        );
        return undefined;
    }
  }

  /**
   * Whose record it is: the user's id; an authenticated request without one is refused (never
   * keyed by address, which many users can share); an anonymous one follows `anonymous`.
   */
  private ownerOf(ctx: ExecutionContext, req: HttpRequest, config: GuardedRoute): KeyOwner {
    const id: unknown = this.getUser(ctx);
    const text = idText(id);
    if (text !== undefined) return { id: text };
    if (req.user || (id !== undefined && id !== null && id !== '')) {
      this.onceFor(`${config.handler}:user`, () =>
        this.logger.error(
          `${config.handler}: the request's user has no usable id (a non-empty string or a number; request.user.id, else .sub), ` +
            'so the guard cannot tell users apart and refuses the call (500). Give IdempotencyModule.forRoot({ getUser: (ctx) => ... }) for your user shape.',
        ),
      );
      throw userUnresolved();
    }
    return this.options.anonymous === 'address' ? { ip: req.ip ?? 'unknown' } : { anonymous: true };
  }

  private onceFor(what: string, log: () => void): void {
    if (this.logged.has(what)) return;
    this.logged.add(what);
    log();
  }

  private routeOf(ctx: ExecutionContext): GuardedRoute | null {
    const handler = ctx.getHandler();
    const controller = ctx.getClass();
    let routes = this.routes.get(controller);
    if (!routes) this.routes.set(controller, (routes = new WeakMap()));
    let config = routes.get(handler);
    if (config === undefined) {
      const metadata = guardedRouteMetadata(controller, handler);
      config = metadata ? route(metadata, ctx, this.options) : null;
      routes.set(handler, config);
    }
    return config;
  }

}

/**
 * A user id as its key segment: a non-empty string, a finite number or a bigint. Anything else
 * (an object, a Buffer, an array) has no text that tells every user apart, so it is refused.
 */
function idText(id: unknown): string | undefined {
  if (typeof id === 'string') return id === '' ? undefined : id;
  if (typeof id === 'number') return Number.isFinite(id) ? String(id) : undefined;
  if (typeof id === 'bigint') return String(id);
  return undefined;
}
