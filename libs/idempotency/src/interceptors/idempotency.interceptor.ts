import {
  Inject,
  Injectable,
  Logger,
  type CallHandler,
  type ExecutionContext,
  type NestInterceptor,
} from '@nestjs/common';
import { HttpAdapterHost, Reflector } from '@nestjs/core';
import { randomUUID } from 'node:crypto';
import { Observable, catchError, concatMap, finalize, of } from 'rxjs';
import type { NoRepeatSubmitMetadata } from '../decorators/no-repeat-submit.decorator.js';
import {
  inProgress,
  keyInvalid,
  keyMissing,
  keyReused,
  payloadUnsupported,
  storeUnavailable,
} from '../errors/idempotency-http.exceptions.js';
import { IdempotencyError } from '../errors/idempotency.errors.js';
import { IDEMPOTENCY_RESOLVED_OPTIONS, type ResolvedIdempotencyOptions } from '../idempotency.config.js';
import { IDEMPOTENCY_KEY_HEADER, NO_REPEAT_SUBMIT_METADATA, REPLAYED_HEADER } from '../idempotency.constants.js';
import { evaluateKeyPath } from '../keys/key-expression.js';
import { fingerprintRequest } from '../keys/fingerprint.js';
import { parseKeyHeader, validateKey } from '../keys/idempotency-key.js';
import { buildStorageKey } from '../keys/storage-key.js';
import { IdempotencyCounters } from '../metrics/idempotency-counters.js';
import {
  IdempotencyStore,
  type ClaimInput,
  type ClaimResult,
  type SavedResponse,
  type SettleWatch,
} from '../stores/idempotency-store.js';
import { route, type GuardedRoute } from './guarded-route.js';
import { isReplayable, readHeaders, type HttpRequest, type HttpResponse } from './http-exchange.js';

/** Marks a request the guard already handles (class and method decorators both apply it). */
const GUARDED = Symbol('idempotency.guarded');

/**
 * The guard behind `@NoRepeatSubmit()`: claims the key (one store round trip), runs the handler,
 * saves its response (one more), and answers duplicates from the store. `getUser` and `getKey`
 * may be overridden in a subclass.
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
    if (!config || ctx.getType() !== 'http') return next.handle();
    const req = ctx.switchToHttp().getRequest<HttpRequest & { [GUARDED]?: true }>();
    if (req[GUARDED]) return next.handle();
    req[GUARDED] = true;
    const res = ctx.switchToHttp().getResponse<HttpResponse>();

    const fingerprint = this.fingerprint(req, config);
    let clientKey = this.getKey(ctx, config);
    if (clientKey === undefined) {
      if (!config.useFingerprint) throw keyMissing(config.keySource);
      clientKey = fingerprint;
    }
    const userId = this.getUser(ctx);
    const key = buildStorageKey({
      prefix: this.options.keyPrefix,
      user: userId === undefined || userId === '' ? { ip: req.ip ?? 'unknown' } : { id: String(userId) },
      handler: config.handler,
      key: clientKey,
    });

    const input: ClaimInput = { key, token: randomUUID(), fingerprint, leaseMs: config.leaseMs };
    let claim: ClaimResult;
    try {
      claim = await this.store.claim(input);
      if (claim.status === 'in_progress' && config.waitForResultMs > 0) {
        this.counters.waited++;
        claim = await this.awaitSettled(input, claim, config.waitForResultMs);
      }
    } catch (error) {
      return this.onStoreOutage(error, config, res, next);
    }
    switch (claim.status) {
      case 'in_progress': {
        this.counters.inProgress++;
        const exception = inProgress(Math.max(1, Math.ceil(claim.retryAfterMs / 1000)));
        this.setHeader(res, 'Retry-After', String(exception.retryAfterSeconds));
        throw exception;
      }
      case 'mismatch':
        this.counters.mismatched++;
        throw keyReused();
      case 'completed':
        this.counters.replayed++;
        return of(this.replay(claim.response, res));
      case 'acquired':
        this.counters.acquired++;
        return this.runOwned(next, key, input.token, config, res);
    }
  }

  /**
   * Waits for a processing key to settle, up to `waitMs`: watch, re-claim (a settlement in
   * between is not missed), then sleep until the store pushes the settlement or the lease ends.
   */
  private async awaitSettled(input: ClaimInput, first: ClaimResult, waitMs: number): Promise<ClaimResult> {
    const deadline = Date.now() + waitMs;
    let claim = first;
    while (claim.status === 'in_progress') {
      const leftMs = deadline - Date.now();
      if (leftMs <= 0) break;
      let watch: SettleWatch;
      try {
        watch = await this.store.watch(input.key);
      } catch (error) {
        this.counters.storeErrors++;
        this.logger.warn(`Cannot wait for a result, answering 409: ${(error as Error).message}`);
        break;
      }
      let timer: NodeJS.Timeout | undefined;
      try {
        claim = await this.store.claim({ ...input, wait: true });
        if (claim.status !== 'in_progress') break;
        const sleepMs = Math.min(leftMs, claim.retryAfterMs + 1);
        await Promise.race([watch.settled, new Promise((resolve) => (timer = setTimeout(resolve, sleepMs)))]);
      } finally {
        clearTimeout(timer);
        watch.cancel();
      }
    }
    return claim;
  }

  /** The user segment of the key. Default: the module's `getUser` (`request.user.id`). */
  protected getUser(ctx: ExecutionContext): string | number | undefined {
    return this.options.getUser(ctx);
  }

  /**
   * The client's key: the route's expression or function, else the `Idempotency-Key` header.
   * Returns undefined when the request has none; throws 400 `IDEMPOTENCY_KEY_INVALID` for a bad one.
   */
  protected getKey(ctx: ExecutionContext, config: GuardedRoute): string | undefined {
    const req = ctx.switchToHttp().getRequest<HttpRequest>();
    const source = config.metadata.key;
    let key: string | undefined;
    if ('header' in source) {
      const parsed = parseKeyHeader(req.headers[IDEMPOTENCY_KEY_HEADER]);
      if (parsed && 'invalid' in parsed) throw keyInvalid(parsed.invalid);
      key = parsed?.key;
    } else if ('resolve' in source) {
      key = source.resolve(ctx);
    } else {
      key = evaluateKeyPath(source.path, {
        body: req.body, headers: req.headers, query: req.query, params: req.params, user: req.user,
      });
    }
    if (key === undefined) return undefined;
    const reason = validateKey(key);
    if (reason) throw keyInvalid(reason);
    return key;
  }

  private fingerprint(req: HttpRequest, config: GuardedRoute): string {
    try {
      return fingerprintRequest(
        {
          method: req.method,
          path: (req.originalUrl ?? req.url).split('?', 1)[0],
          query: req.query,
          body: req.body,
          rawBody: req.rawBody,
          contentType: req.headers['content-type'] as string | undefined,
        },
        config.ignoreFields,
      );
    } catch (error) {
      if (error instanceof IdempotencyError) throw payloadUnsupported(error.message);
      throw error;
    }
  }

  private runOwned(next: CallHandler, key: string, token: string, config: GuardedRoute, res: HttpResponse) {
    let settled = false;
    const settle = () => !settled && (settled = true);
    return next.handle().pipe(
      concatMap(async (value) => {
        if (settle()) await this.save(value, key, token, config, res);
        return value;
      }),
      catchError(async (error: unknown) => {
        if (settle()) await this.release(key, token);
        throw error;
      }),
      // Completed without a value, or the client went away: free the key for a retry.
      finalize(() => {
        if (settle()) void this.release(key, token);
      }),
    );
  }

  private async save(value: unknown, key: string, token: string, config: GuardedRoute, res: HttpResponse) {
    const statusCode = res.statusCode;
    const body = statusCode < 500 && isReplayable(value) ? serialize(value) : null;
    if (body === null) {
      // Streams, buffers and 5xx answers are not replayed: free the key so a retry runs again.
      await this.release(key, token);
      return;
    }
    const response: SavedResponse = { statusCode, headers: readHeaders(res, this.options.replayHeaders), body };
    try {
      const saved = await this.store.complete(key, token, response, config.expireMs);
      if (!saved) {
        this.counters.lateCompletions++;
        this.logger.warn(`${config.handler}: the lease ran out before the handler finished; its response was not saved`);
      }
    } catch (error) {
      // The business effect happened: answer it. The claim expires with its lease.
      this.counters.storeErrors++;
      this.logger.error(`${config.handler}: could not save the response: ${(error as Error).message}`);
    }
  }

  private async release(key: string, token: string): Promise<void> {
    try {
      if (await this.store.release(key, token)) this.counters.released++;
    } catch (error) {
      this.counters.storeErrors++;
      this.logger.error(`Could not release an idempotency key (it frees when its lease ends): ${(error as Error).message}`);
    }
  }

  private replay(saved: SavedResponse, res: HttpResponse): unknown {
    for (const [name, value] of Object.entries(saved.headers)) this.setHeader(res, name, value);
    this.setHeader(res, REPLAYED_HEADER, 'true');
    const value = saved.body === undefined ? undefined : JSON.parse(saved.body);
    if (saved.statusCode === res.statusCode) return value;
    // Only a web Response carries its own status past Nest's reply().
    const isText = typeof value === 'string';
    const contentType = saved.headers['content-type'] ?? (isText ? 'text/html; charset=utf-8' : 'application/json; charset=utf-8');
    return new Response(value === undefined ? null : isText ? value : saved.body, {
      status: saved.statusCode,
      headers: { 'content-type': contentType },
    });
  }

  private onStoreOutage(error: unknown, config: GuardedRoute, res: HttpResponse, next: CallHandler) {
    this.counters.storeErrors++;
    if (config.failMode === 'closed') {
      this.logger.warn(`${config.handler}: idempotency store unavailable, answering 503: ${(error as Error).message}`);
      const exception = storeUnavailable(1);
      this.setHeader(res, 'Retry-After', String(exception.retryAfterSeconds));
      throw exception;
    }
    this.counters.failOpen++;
    this.logger.warn(`${config.handler}: idempotency store unavailable, running unguarded: ${(error as Error).message}`);
    return next.handle();
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

  private setHeader(res: HttpResponse, name: string, value: string): void {
    this.adapterHost.httpAdapter.setHeader(res, name, value);
  }
}

function serialize(value: unknown): string | undefined | null {
  if (value === undefined) return undefined;
  try {
    return JSON.stringify(value);
  } catch {
    return null; // BigInt, cycles: not replayable
  }
}
