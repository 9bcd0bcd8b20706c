import {
  Inject,
  Injectable,
  Logger,
  type CallHandler,
  type ExecutionContext,
  type NestInterceptor,
} from '@nestjs/common';
import { HttpAdapterHost, Reflector } from '@nestjs/core';
import { Observable, of } from 'rxjs';
import type { NoRepeatSubmitMetadata } from '../decorators/no-repeat-submit.decorator.js';
import { keyInvalid } from '../errors/idempotency-http.exceptions.js';
import { IDEMPOTENCY_RESOLVED_OPTIONS, type ResolvedIdempotencyOptions } from '../idempotency.config.js';
import { IDEMPOTENCY_KEY_HEADER, NO_REPEAT_SUBMIT_METADATA } from '../idempotency.constants.js';
import { parseKeyHeader, validateKey } from '../keys/idempotency-key.js';
import { evaluateKeyPath } from '../keys/key-expression.js';
import { buildStorageKey } from '../keys/storage-key.js';
import { IdempotencyCounters, type IdempotencyMetricsSink } from '../metrics/idempotency-counters.js';
import { IdempotencyStore, type ClaimInput, type ClaimResult } from '../stores/idempotency-store.js';
import { awaitSettled } from './await-settled.js';
import type { GuardExchange } from './guard-exchange.js';
import { route, type GuardedRoute } from './guarded-route.js';
import { HttpExchange, type HttpRequest, type HttpResponse } from './http-exchange.js';
import { ownerToken } from './owner-token.js';
import { RpcExchange } from './rpc-exchange.js';

/** Marks a request the guard already handles (class and method decorators both apply it). */
const GUARDED = Symbol('idempotency.guarded');

/**
 * The guard behind `@NoRepeatSubmit()`: claims the key (one store round trip), runs the handler,
 * saves its answer (one more), and answers duplicates from the store. HTTP requests and RPC
 * messages alike. `getUser` and `getKey` may be overridden in a subclass.
 */
@Injectable()
export class IdempotencyInterceptor implements NestInterceptor {
  private readonly logger = new Logger('Idempotency');
  private readonly routes = new WeakMap<object, GuardedRoute | null>();

  constructor(
    private readonly reflector: Reflector,
    private readonly adapterHost: HttpAdapterHost,
    private readonly store: IdempotencyStore,
    private readonly counters: IdempotencyCounters,
    @Inject(IDEMPOTENCY_RESOLVED_OPTIONS) private readonly options: ResolvedIdempotencyOptions,
  ) {}

  async intercept(ctx: ExecutionContext, next: CallHandler): Promise<Observable<unknown>> {
    const config = this.routeOf(ctx);
    if (!config) return next.handle();
    const exchange = await this.exchangeOf(ctx, config);
    if (!exchange) return next.handle();

    const clientKey = exchange.clientKey ?? (config.useFingerprint ? exchange.fingerprint : undefined);
    if (clientKey === undefined) return exchange.refuse({ reason: 'key_missing', source: config.keySource });
    const key = buildStorageKey({ prefix: this.options.keyPrefix, user: exchange.owner, handler: config.handler, key: clientKey });
    const input: ClaimInput = { key, token: ownerToken(), fingerprint: exchange.fingerprint, leaseMs: config.leaseMs };

    let claim: ClaimResult;
    try {
      claim = await this.timed('claim', () => this.store.claim(input));
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
        return exchange.refuse({ reason: 'store_unavailable' });
      }
      this.counters.count('failOpen', config.handler);
      this.logger.warn(`${message}; running unguarded`);
      return next.handle();
    }
    switch (claim.status) {
      case 'in_progress':
        this.counters.count('inProgress', config.handler);
        return exchange.refuse({ reason: 'in_progress', retryAfterMs: claim.retryAfterMs });
      case 'mismatch':
        this.counters.count('mismatched', config.handler);
        return exchange.refuse({ reason: 'key_reused' });
      case 'completed':
        this.counters.count('replayed', config.handler);
        return of(exchange.replay(claim.response));
      case 'acquired':
        this.counters.count('acquired', config.handler);
        return this.runOwned(next, input, config, exchange);
    }
  }

  /** The user segment of the key. Default: the module's `getUser` (`request.user.id`). */
  protected getUser(ctx: ExecutionContext): string | number | undefined {
    return this.options.getUser(ctx);
  }

  /**
   * The client's key: the route's expression or function, else the `Idempotency-Key` header.
   * Returns undefined when the call has none; throws 400 `IDEMPOTENCY_KEY_INVALID` for a bad one.
   */
  protected getKey(ctx: ExecutionContext, config: GuardedRoute): string | undefined {
    const source = config.metadata.key;
    const req = ctx.getType() === 'http' ? ctx.getArgByIndex<HttpRequest>(0) : undefined;
    let key: string | undefined;
    if ('header' in source) {
      const parsed = parseKeyHeader(req?.headers[IDEMPOTENCY_KEY_HEADER]);
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
        const req = ctx.getArgByIndex<HttpRequest & { [GUARDED]?: true }>(0);
        if (req[GUARDED]) return undefined;
        req[GUARDED] = true;
        const { httpAdapter } = this.adapterHost;
        const res = ctx.getArgByIndex<HttpResponse>(1);
        return new HttpExchange(req, res, config, httpAdapter, this.options.replayHeaders, this.getUser(ctx), this.getKey(ctx, config));
      }
      case 'rpc':
        return RpcExchange.create(ctx, config, () => this.getKey(ctx, config));
      default:
        return undefined;
    }
  }

  /**
   * Runs the handler while owning the key. Its first value is saved before it is sent on (later
   * values follow in order); an error, or completing without a value, or the client going away,
   * releases the key for a retry. One Observable rather than an operator chain: this runs on
   * every first request.
   */
  private runOwned(next: CallHandler, { key, token }: ClaimInput, config: GuardedRoute, exchange: GuardExchange) {
    return new Observable<unknown>((subscriber) => {
      let settled = false;
      let sent: Promise<unknown> = Promise.resolve();
      const release = () => this.release(key, token, config.handler);
      const source = next.handle().subscribe({
        next: (value) => {
          const ready = settled ? sent : this.save(value, key, token, config, exchange);
          settled = true;
          sent = ready.then(
            () => subscriber.next(value),
            (error: unknown) => subscriber.error(error),
          );
        },
        error: (error: unknown) => {
          const ready = settled ? sent : release();
          settled = true;
          void ready.then(() => subscriber.error(error));
        },
        complete: () => {
          void sent.then(() => {
            if (!settled) {
              settled = true;
              void release();
            }
            subscriber.complete();
          });
        },
      });
      return () => {
        source.unsubscribe();
        if (!settled) {
          settled = true;
          void release();
        }
      };
    });
  }

  private async save(value: unknown, key: string, token: string, config: GuardedRoute, exchange: GuardExchange) {
    const response = exchange.capture(value);
    if (!response) return this.release(key, token, config.handler);
    try {
      const saved = await this.timed('complete', () => this.store.complete(key, token, response, config.expireMs));
      if (!saved) {
        this.counters.count('lateCompletions', config.handler);
        this.logger.warn(`${config.handler}: the lease ran out before the handler finished; its response was not saved`);
      }
    } catch (error) {
      // The business effect happened: answer it. The claim expires with its lease.
      this.counters.count('storeErrors', config.handler);
      this.logger.error(`${config.handler}: could not save the response: ${(error as Error).message}`);
    }
  }

  private async release(key: string, token: string, handler: string): Promise<void> {
    try {
      if (await this.timed('release', () => this.store.release(key, token))) this.counters.count('released', handler);
    } catch (error) {
      this.counters.count('storeErrors', handler);
      this.logger.error(`Could not release an idempotency key (it frees when its lease ends): ${(error as Error).message}`);
    }
  }

  /** Runs a store call, timing it when a metrics sink is configured (else the call's own promise). */
  private timed<T>(operation: 'claim' | 'complete' | 'release', call: () => Promise<T>): Promise<T> {
    const { sink } = this.counters;
    return sink ? this.timedBy(sink, operation, call) : call();
  }

  private async timedBy<T>(sink: IdempotencyMetricsSink, operation: 'claim' | 'complete' | 'release', call: () => Promise<T>): Promise<T> {
    const started = performance.now();
    try {
      return await call();
    } finally {
      sink.observeStore(operation, (performance.now() - started) / 1000);
    }
  }

  private routeOf(ctx: ExecutionContext): GuardedRoute | null {
    const handler = ctx.getHandler();
    let config = this.routes.get(handler);
    if (config === undefined) {
      const metadata = this.reflector.getAllAndOverride<NoRepeatSubmitMetadata | undefined>(
        NO_REPEAT_SUBMIT_METADATA,
        [handler, ctx.getClass()],
      );
      config = metadata ? route(metadata, ctx, this.options) : null;
      this.routes.set(handler, config);
    }
    return config;
  }
}
