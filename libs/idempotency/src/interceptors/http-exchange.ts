import { Logger, StreamableFile, type CallHandler } from '@nestjs/common';
import type { AbstractHttpAdapter } from '@nestjs/core';
import { isUtf8 } from 'node:buffer';
import type { ServerResponse } from 'node:http';
import { of, type Observable } from 'rxjs';
import {
  inProgress,
  keyInvalid,
  keyMissing,
  keyReused,
  payloadUnsupported,
  responseNotReplayable,
  storeUnavailable,
  userUnresolved,
  type IdempotencyHttpException,
} from '../errors/idempotency-http.exceptions.js';
import { PROBLEM_JSON_CONTENT_TYPE } from '../errors/problem-details.js';
import type { FingerprintInput } from '../keys/fingerprint.js';
import type { SavedResponse, UnreplayableReason } from '../stores/idempotency-store.js';
import { notModifiedFits } from './conditional-replay.js';
import type { GuardExchange, GuardRefusal, HeldClaim } from './exchange.js';
import { watchHandler } from './handler-start.js';
import { runHeld } from './held-run.js';
import { httpFingerprintInput } from './http-fingerprint.js';
import type { HttpRequest, HttpResponse } from './http-request.js';
import { clearRefusalHeaders, setRefusalHeaders } from './refusal-headers.js';
import { ResponseCapture, type CapturedResponse } from './response-capture.js';
import { replayInto, sendNow } from './response-replay.js';
import { matchedRoutePath } from './route-paths.js';
import type { GuardedRoute } from './route-options.js';

/** The longest `Retry-After` a 409 asks for, in seconds. */
export const MAX_RETRY_AFTER_SECONDS = 2;

/** What a duplicate is told when the first answer was not kept, by reason. */
const NOT_REPLAYABLE: Record<UnreplayableReason, string> = {
  too_large: 'the response was larger than the server keeps',
  not_delivered: "the first request's answer never reached its client whole: another answer went out first (e.g. a timeout's), or it was cut off mid-way",
  server_error: 'the server failed while answering the first request',
  // Written for message handlers only (RpcExchange); said here for a record an app moved over.
  not_serializable: 'the first answer could not be kept as JSON',
  partial: "the first answer was to that request's Range or precondition headers (a part of the resource, or 412)",
};
/** What a duplicate is told when the first answer was a 304 that does not fit it (`notModifiedFits`). */
const NOT_MODIFIED_ELSEWHERE =
  "the first request was conditional and was answered 304 Not Modified, without a body; this request's validators do not match it";

const logger = new Logger('Idempotency');

/** The request headers that shape an answer to a part of a resource, or to a precondition. */
const RANGE_AND_PRECONDITION_HEADERS = ['range', 'if-match', 'if-unmodified-since', 'if-range', 'if-none-match'] as const;

/**
 * The latest exchange of each request, on the request itself: an outer `retry()` subscribes the
 * guard again within one request (see `HttpExchange.create`). Not a WeakMap keyed by requests:
 * one entry per request made the collector's ephemeron work cost ~30 µs a request in-process
 * (`npm run bench -- --phases interceptor`, session 20).
 */
const LATEST = Symbol('idempotency.latestExchange');
type WithLatest = { [LATEST]?: HttpExchange };

/**
 * An HTTP request under the guard (Express or Fastify). The answer it saves and replays is the
 * one the client received, read off the Node.js response after the whole app pipeline.
 */
export class HttpExchange implements GuardExchange {
  private readonly raw: ServerResponse;
  /** Set while the answer to an error of the method is awaited: frees the key and lets that answer go unsaved. */
  private forgoFailure: (() => Promise<void>) | undefined;
  /** The request was subscribed again (`create`): the answer it gets is not this run's. */
  private superseded = false;

  private constructor(
    private readonly req: HttpRequest,
    private readonly res: HttpResponse,
    private readonly route: GuardedRoute,
    private readonly adapter: AbstractHttpAdapter,
    private readonly replayHeaders: readonly string[],
  ) {
    this.raw = 'raw' in res ? res.raw : res;
  }

  /**
   * The exchange of one subscription to the guard. A request subscribed again (an outer
   * `retry()`) marks the earlier subscription's run superseded: the answer the request gets is
   * the later one's, never the earlier run's, so it is not saved as that run's. Where the earlier
   * run succeeded, its key stays held and the new subscription is refused 409 in progress: the
   * guard cannot tell a COMMIT outside it that failed (nothing happened) from a timeout's retry
   * while that COMMIT still runs (it will happen), so the handler never runs twice for one
   * request; the earlier run is saved as not replayable. That 409 was saved as the run's answer
   * and replayed for the key's whole retention (an adversarial helper), and freeing the key
   * instead ran a timeout's retry beside the COMMIT (another). On a route with `saveStatuses`, a
   * request subscribed again after the method failed first frees the key the earlier run holds
   * while its error's answer is awaited, and the retry runs the handler again, as it does
   * without `saveStatuses`.
   */
  static create(
    req: HttpRequest,
    res: HttpResponse,
    route: GuardedRoute,
    adapter: AbstractHttpAdapter,
    replayHeaders: readonly string[],
  ): HttpExchange | Promise<HttpExchange> {
    const exchange = new HttpExchange(req, res, route, adapter, replayHeaders);
    const holder = req as unknown as WithLatest;
    const earlier = holder[LATEST];
    holder[LATEST] = exchange;
    if (!earlier) return exchange;
    earlier.superseded = true;
    const forgo = earlier.forgoFailure;
    // A promise only when there is a key to free first: every await is a turn of the microtask queue.
    return forgo ? forgo().then(() => exchange) : exchange;
  }

  /**
   * The route, not the URL: every spelling the router maps to this handler (`/orders/`,
   * `/ORDERS`) is one request; the path parameters tell requests to the same handler apart.
   * The body as its parser gave it, and the uploaded files (see `httpFingerprintInput`).
   */
  fingerprintInput(): FingerprintInput | Promise<FingerprintInput> {
    return httpFingerprintInput(this.req, this.keyHandler());
  }

  /** `Controller.method`, and the matched route path where the handler answers at several (`route-paths`). */
  keyHandler(): string {
    const keyPath = this.route.routeKeyPath;
    if (!keyPath) return this.route.handler;
    const path = matchedRoutePath(this.req);
    return path === undefined ? this.route.handler : `${this.route.handler}#${keyPath(path)}`;
  }

  /**
   * Runs the handler: saves the answer the client gets to its value, or releases the key when it
   * fails. On a route with `saveStatuses`, a failure in the method itself (not in a pipe before
   * it) leaves the answer to the app's exception filters, and that answer is saved when its
   * status is one the route saves; otherwise the key is released as it goes out.
   */
  run(next: CallHandler, claim: HeldClaim): Observable<unknown> {
    const { maxResponseBytes, holdsResponse, savesStatus } = this.route;
    let failedInMethod = false;
    let fileFailed = false;
    clearRefusalHeaders(this.res, this.raw);
    const answers = !holdsResponse ? 'nest' : this.route.sendsOwnResponse ? 'handler' : 'run';
    const capture: ResponseCapture = new ResponseCapture(this.raw, this.replayHeaders, maxResponseBytes, answers, (sent) =>
      failedInMethod ? this.settleFailure(claim, sent) : claim.save(this.savedOf(sent, capture, fileFailed)),
    );
    const watched = savesStatus ? capture.owning(() => watchHandler(next, this.route.takesStartMark ? this.req : undefined)) : undefined;
    /** The app's answer to the method's error is the one to save, by its status (`settleFailure`). */
    const answerFailure = () => {
      failedInMethod = true;
      this.forgoFailure = () => {
        this.forgoFailure = undefined;
        capture.passThrough();
        return claim.release();
      };
      capture.succeed();
    };
    return runHeld(
      watched ? watched.handled : capture.owning(() => next.handle()),
      {
        succeeded: async (value, cut) => {
          // Cut off first: the client got another answer (the capture let it through).
          if (cut) return claim.save(toSaved(undefined, this.raw.statusCode));
          // Heard before Nest's own listener, which answers the failure (see `savedOf`).
          if (value instanceof StreamableFile) value.getStream().once('error', () => (fileFailed = true));
          capture.succeed();
        },
        failed: async (cut) => {
          if (watched?.began() && !cut) return answerFailure();
          await claim.release();
          capture.passThrough();
        },
        // Nest answers the Observable with its error: that answer goes out unsaved and the key is
        // freed, or it is saved where the route saves its status (the method itself failed).
        failedAfterValue: async () => {
          if (watched?.began()) return answerFailure();
          await claim.release();
          capture.passThrough();
        },
        cut: () => capture.cutOff(),
      },
      claim.holdMs,
    );
  }

  /**
   * The answer the app gave to an error of the method: saved when the route saves its status,
   * else the key is released (a 5xx, another status, or no answer).
   */
  private settleFailure(claim: HeldClaim, sent: CapturedResponse | undefined): Promise<void> {
    this.forgoFailure = undefined;
    return sent && this.savesStatus(sent.statusCode) ? claim.save(toSaved(sent, sent.statusCode)) : claim.release();
  }

  /**
   * What a run that succeeded saves of the answer sent. A `StreamableFile` whose stream failed
   * (a file gone, a bucket's read refused) is answered by Nest, 400 on Express and 500 on
   * Fastify: the app's answer to a failed read, not the handler's. The 400 was saved and
   * replayed to every retry for the key's retention (an adversarial helper); it is kept as not
   * replayable, as the 500 is, on both adapters.
   */
  private savedOf(sent: CapturedResponse | undefined, capture: ResponseCapture, fileFailed: boolean): SavedResponse {
    // Another answer went out: a later subscription's (an outer retry), or an outer timeout's
    // 408 after the method's value (a COMMIT outside the guard still running), which was saved
    // and replayed to every retry (an adversarial helper).
    if (!sent || this.superseded || sent.statusCode === 408) return toSaved(undefined, this.raw.statusCode);
    if (fileFailed) return unreplayable(sent, 'server_error');
    if (this.shapedByPreconditions(sent, capture)) return unreplayable(sent, 'partial');
    return toSaved(sent, this.raw.statusCode);
  }

  /**
   * Whether the answer is one to this request's Range or precondition headers (`Range`,
   * `If-Match`, `If-Unmodified-Since`, `If-Range`, `If-None-Match`: a create-only PUT's `*`): a
   * 206 or 416 (a `Content-Range` on any status: Nest's 201 over a partial file on Fastify) or
   * a 412. Replayed, it went to duplicates that never asked for it: ten bytes of a file saved
   * as the whole file, a 206 without its `Content-Range`, a 412 to a retry without `If-Match`.
   * A 304 is `notModifiedFits`' case.
   */
  private shapedByPreconditions(sent: CapturedResponse, capture: ResponseCapture): boolean {
    const headers = this.req.headers;
    if (!RANGE_AND_PRECONDITION_HEADERS.some((name) => headers[name] !== undefined)) return false;
    const status = sent.statusCode;
    return status === 206 || status === 412 || status === 416 || capture.headerOf('content-range') !== undefined;
  }

  /** The route's `saveStatuses` on this status; a function that throws saves nothing (logged). */
  private savesStatus(status: number): boolean {
    try {
      return this.route.savesStatus?.(status) ?? false;
    } catch (error) {
      logger.error(`${this.route.handler}: saveStatuses threw (${(error as Error).message}); the answer is not saved and the key is released`);
      return false;
    }
  }

  replay(saved: SavedResponse): Observable<unknown> {
    clearRefusalHeaders(this.res, this.raw);
    if (saved.unreplayable) throw this.withHeaders(responseNotReplayable(NOT_REPLAYABLE[saved.unreplayable], this.route.errorFormat));
    if (saved.statusCode === 304 && !notModifiedFits(saved, this.req)) {
      throw this.withHeaders(responseNotReplayable(NOT_MODIFIED_ELSEWHERE, this.route.errorFormat));
    }
    if (this.route.sendsOwnResponse) {
      sendNow(this.raw, saved, this.replayHeaders);
      return of(undefined);
    }
    replayInto(this.raw, saved, this.replayHeaders);
    if (this.route.renders) {
      skipViewEngine(this.res);
      return of(undefined);
    }
    return of(valueOf(saved));
  }

  refuse(refusal: GuardRefusal): Observable<unknown> {
    const leaving = refusal.reason === 'store_unavailable' && refusal.shuttingDown === true;
    throw this.withHeaders(toHttpException(refusal, this.route), leaving);
  }

  /**
   * The refusal's headers, set before it is thrown: whatever exception filter answers it sends
   * them. Nest's own sends the problem details under their media type on both adapters; a
   * filter of the app's that writes another body should set its own Content-Type. An answer
   * that is not this refusal does not keep them (see `setRefusalHeaders`). An instance shutting
   * down (`leaving`) also closes the connection after its 503: kept alive, a client's retry came
   * back to it on the same connection, and was refused again, until the server closed.
   */
  private withHeaders(exception: IdempotencyHttpException, leaving = false): IdempotencyHttpException {
    const headers: Record<string, string> = {};
    if (exception.retryAfterSeconds !== undefined) headers['Retry-After'] = String(exception.retryAfterSeconds);
    if (this.route.errorFormat === 'problem+json') headers['Content-Type'] = PROBLEM_JSON_CONTENT_TYPE;
    setRefusalHeaders(this.res, this.raw, this.adapter, exception.getStatus(), headers, leaving);
    return exception;
  }
}

const unreplayable = (sent: CapturedResponse, reason: UnreplayableReason): SavedResponse => ({ statusCode: sent.statusCode, headers: {}, unreplayable: reason });

/** The answer sent as a record: its bytes as text (or base64), or why it is not replayable. */
function toSaved(sent: CapturedResponse | undefined, statusCode: number): SavedResponse {
  if (!sent) return { statusCode, headers: {}, unreplayable: 'not_delivered' };
  if (sent.statusCode >= 500) return unreplayable(sent, 'server_error');
  if (sent.body === undefined) return { statusCode: sent.statusCode, headers: sent.headers, unreplayable: 'too_large' };
  const saved: SavedResponse = { statusCode: sent.statusCode, headers: sent.headers };
  if (sent.body.length === 0) return saved;
  if (typeof sent.body === 'string') {
    saved.body = sent.body;
  } else if (isUtf8(sent.body) && !sent.body.includes(0)) {
    saved.body = sent.body.toString('utf8');
  } else {
    saved.body = sent.body.toString('base64');
    saved.encoding = 'base64';
  }
  return saved;
}

/**
 * A `@Render()` route's replay is the rendered page itself: Nest would hand the replay's value to
 * the view engine as the template's data (Express `res.render`, Fastify `reply.view`), which
 * fails, or renders a page the replay then drops. This response ends instead, and the replay
 * sends the saved page.
 */
function skipViewEngine(res: HttpResponse): void {
  const response = res as { render?: unknown; view?: unknown; end?: () => unknown; send?: () => unknown };
  if ('render' in response) response.render = () => response.end?.();
  if ('view' in response) response.view = () => response.send?.();
}

/**
 * The value a replay hands the app's pipeline, for interceptors that look at it (what is sent
 * is the saved bytes either way): the JSON value, else the text, else nothing.
 */
function valueOf(saved: SavedResponse): unknown {
  if (saved.body === undefined || saved.encoding === 'base64') return undefined;
  if (saved.headers['content-type']?.includes('json')) {
    try {
      return JSON.parse(saved.body);
    } catch {
      return saved.body;
    }
  }
  return saved.body;
}

function toHttpException(refusal: GuardRefusal, route: GuardedRoute): IdempotencyHttpException {
  const format = route.errorFormat;
  switch (refusal.reason) {
    case 'user_unresolved':
      return userUnresolved(format);
    case 'key_invalid':
      return keyInvalid(refusal.problem, format);
    case 'payload_unsupported':
      return payloadUnsupported(refusal.problem, format);
    case 'key_missing':
      return keyMissing(route.keySource, format);
    case 'in_progress':
      // The lease left is only the worst case (up to leaseSeconds); most first requests end far
      // sooner, so a client is told to look again within MAX_RETRY_AFTER_SECONDS.
      return inProgress(Math.min(MAX_RETRY_AFTER_SECONDS, Math.max(1, Math.ceil(refusal.retryAfterMs / 1000))), format);
    case 'key_reused':
      return keyReused(format);
    case 'store_unavailable':
      return storeUnavailable(1, format, refusal.shuttingDown);
  }
}
