import type { CallHandler } from '@nestjs/common';
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
import type { FingerprintInput } from '../keys/fingerprint.js';
import type { SavedResponse, UnreplayableReason } from '../stores/idempotency-store.js';
import type { GuardExchange, GuardRefusal, HeldClaim } from './exchange.js';
import { runHeld } from './held-run.js';
import type { HttpRequest, HttpResponse } from './http-request.js';
import { ResponseCapture, type CapturedResponse } from './response-capture.js';
import { replayInto, sendNow } from './response-replay.js';
import type { GuardedRoute } from './route-options.js';

/** The longest `Retry-After` a 409 asks for, in seconds. */
export const MAX_RETRY_AFTER_SECONDS = 2;

/** What a duplicate is told when the first answer was not kept, by reason. */
const NOT_REPLAYABLE: Record<UnreplayableReason, string> = {
  too_large: 'the response was larger than the server keeps',
  not_delivered: 'the first request was answered before its handler finished, e.g. by a timeout',
  server_error: 'the server failed while answering the first request',
};

/**
 * An HTTP request under the guard (Express or Fastify). The answer it saves and replays is the
 * one the client received, read off the Node.js response after the whole app pipeline.
 */
export class HttpExchange implements GuardExchange {
  private readonly raw: ServerResponse;

  constructor(
    private readonly req: HttpRequest,
    private readonly res: HttpResponse,
    private readonly route: GuardedRoute,
    private readonly adapter: AbstractHttpAdapter,
    private readonly replayHeaders: readonly string[],
  ) {
    this.raw = 'raw' in res ? res.raw : res;
  }

  /**
   * The route, not the URL: every spelling the router maps to this handler (`/orders/`,
   * `/ORDERS`) is one request; the path parameters tell requests to the same handler apart.
   */
  fingerprintInput(): FingerprintInput {
    const { req } = this;
    return {
      method: req.method,
      path: this.route.handler,
      query: { params: req.params, query: req.query },
      body: req.body,
      rawBody: req.rawBody,
      contentType: req.headers['content-type'] as string | undefined,
    };
  }

  run(next: CallHandler, claim: HeldClaim): Observable<unknown> {
    const { maxResponseBytes, sendsOwnResponse } = this.route;
    const capture = new ResponseCapture(this.raw, this.replayHeaders, maxResponseBytes, sendsOwnResponse, (sent) =>
      claim.save(toSaved(sent, this.raw.statusCode)),
    );
    return runHeld(
      next.handle(),
      {
        succeeded: async (_value, cut) => {
          // Cut off first: the client got another answer (the capture let it through).
          if (cut) return claim.save(toSaved(undefined, this.raw.statusCode));
          capture.succeed();
        },
        failed: async () => {
          await claim.release();
          capture.passThrough();
        },
        cut: () => capture.passThrough(),
      },
      claim.holdMs,
    );
  }

  replay(saved: SavedResponse): Observable<unknown> {
    if (saved.unreplayable) throw responseNotReplayable(NOT_REPLAYABLE[saved.unreplayable]);
    if (this.route.sendsOwnResponse) {
      sendNow(this.raw, saved, this.replayHeaders);
      return of(undefined);
    }
    replayInto(this.raw, saved, this.replayHeaders);
    return of(valueOf(saved));
  }

  refuse(refusal: GuardRefusal): Observable<unknown> {
    throw this.withRetryAfter(toHttpException(refusal, this.route));
  }

  private withRetryAfter(exception: IdempotencyHttpException): IdempotencyHttpException {
    if (exception.retryAfterSeconds !== undefined) {
      this.adapter.setHeader(this.res, 'Retry-After', String(exception.retryAfterSeconds));
    }
    return exception;
  }
}

/** The answer sent as a record: its bytes as text (or base64), or why it is not replayable. */
function toSaved(sent: CapturedResponse | undefined, statusCode: number): SavedResponse {
  if (!sent) return { statusCode, headers: {}, unreplayable: 'not_delivered' };
  if (sent.statusCode >= 500) return { statusCode: sent.statusCode, headers: {}, unreplayable: 'server_error' };
  if (!sent.body) return { statusCode: sent.statusCode, headers: sent.headers, unreplayable: 'too_large' };
  const saved: SavedResponse = { statusCode: sent.statusCode, headers: sent.headers };
  if (sent.body.length === 0) return saved;
  if (isUtf8(sent.body) && !sent.body.includes(0)) {
    saved.body = sent.body.toString('utf8');
  } else {
    saved.body = sent.body.toString('base64');
    saved.encoding = 'base64';
  }
  return saved;
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
  switch (refusal.reason) {
    case 'user_unresolved':
      return userUnresolved();
    case 'key_invalid':
      return keyInvalid(refusal.problem);
    case 'payload_unsupported':
      return payloadUnsupported(refusal.problem);
    case 'key_missing':
      return keyMissing(route.keySource);
    case 'in_progress':
      // The lease left is only the worst case (up to leaseSeconds); most first requests end far
      // sooner, so a client is told to look again within MAX_RETRY_AFTER_SECONDS.
      return inProgress(Math.min(MAX_RETRY_AFTER_SECONDS, Math.max(1, Math.ceil(refusal.retryAfterMs / 1000))));
    case 'key_reused':
      return keyReused();
    case 'store_unavailable':
      return storeUnavailable(1);
  }
}
