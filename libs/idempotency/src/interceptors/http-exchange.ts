import { StreamableFile } from '@nestjs/common';
import type { AbstractHttpAdapter } from '@nestjs/core';
import { Readable } from 'node:stream';
import { isObservable, type Observable } from 'rxjs';
import { IdempotencyError } from '../errors/idempotency.errors.js';
import {
  inProgress,
  keyMissing,
  keyReused,
  payloadUnsupported,
  storeUnavailable,
  type IdempotencyHttpException,
} from '../errors/idempotency-http.exceptions.js';
import { REPLAYED_HEADER } from '../idempotency.constants.js';
import { fingerprintRequest } from '../keys/fingerprint.js';
import type { KeyOwner } from '../keys/storage-key.js';
import type { SavedResponse } from '../stores/idempotency-store.js';
import { deserialize, serialize, type GuardExchange, type GuardRefusal } from './guard-exchange.js';
import type { GuardedRoute } from './guarded-route.js';

/** The parts of an Express or Fastify request the guard reads. */
export interface HttpRequest {
  method: string;
  url: string;
  originalUrl?: string;
  ip?: string;
  headers: Record<string, string | string[] | undefined>;
  body?: unknown;
  rawBody?: Buffer;
  query?: unknown;
  params?: unknown;
  user?: unknown;
}

/** The parts of an Express response or Fastify reply the guard reads. */
export interface HttpResponse {
  statusCode: number;
  getHeader(name: string): number | string | string[] | undefined;
}

/** The longest `Retry-After` a 409 asks for, in seconds. */
export const MAX_RETRY_AFTER_SECONDS = 2;

/** An HTTP request under the guard (Express or Fastify, through Nest's HTTP adapter). */
export class HttpExchange implements GuardExchange {
  readonly fingerprint: string;
  readonly owner: KeyOwner;
  constructor(
    private readonly req: HttpRequest,
    private readonly res: HttpResponse,
    private readonly route: GuardedRoute,
    private readonly adapter: AbstractHttpAdapter,
    private readonly replayHeaders: readonly string[],
    userId: string | number | undefined,
    readonly clientKey: string | undefined,
  ) {
    this.owner = userId === undefined || userId === '' ? { ip: this.req.ip ?? 'unknown' } : { id: String(userId) };
    this.fingerprint = this.fingerprintOf(this.req);
  }

  replay(saved: SavedResponse): unknown {
    for (const [name, value] of Object.entries(saved.headers)) this.adapter.setHeader(this.res, name, value);
    this.adapter.setHeader(this.res, REPLAYED_HEADER, 'true');
    const value = deserialize(saved);
    if (saved.statusCode === this.res.statusCode) return value;
    // Only a web Response carries its own status past Nest's reply().
    const isText = typeof value === 'string';
    const contentType =
      saved.headers['content-type'] ?? (isText ? 'text/html; charset=utf-8' : 'application/json; charset=utf-8');
    return new Response(value === undefined ? null : isText ? value : saved.body, {
      status: saved.statusCode,
      headers: { 'content-type': contentType },
    });
  }

  capture(value: unknown): SavedResponse | null {
    const { statusCode } = this.res;
    // Streams, buffers and 5xx answers are not replayed: a retry runs again.
    const body = statusCode < 500 && isReplayable(value) ? serialize(value) : null;
    if (body === null) return null;
    return { statusCode, headers: readHeaders(this.res, this.replayHeaders), body };
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

  private fingerprintOf(req: HttpRequest): string {
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
        this.route.ignoreFields,
      );
    } catch (error) {
      if (error instanceof IdempotencyError) throw payloadUnsupported(error.message);
      throw error;
    }
  }
}

function toHttpException(refusal: GuardRefusal, route: GuardedRoute): IdempotencyHttpException {
  switch (refusal.reason) {
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

/** Whether a handler's value can be saved as JSON text and replayed as the same answer. */
export function isReplayable(value: unknown): boolean {
  if (value === null || typeof value !== 'object') return typeof value !== 'function' && typeof value !== 'symbol';
  return !(
    value instanceof StreamableFile ||
    value instanceof Readable ||
    value instanceof Response ||
    value instanceof ReadableStream ||
    Buffer.isBuffer(value) ||
    ArrayBuffer.isView(value) ||
    isObservable(value) ||
    Symbol.asyncIterator in value
  );
}

/** The allowlisted headers already set on the response, lower-case names. */
export function readHeaders(res: HttpResponse, names: readonly string[]): Record<string, string> {
  const headers: Record<string, string> = {};
  for (const name of names) {
    const value = res.getHeader(name);
    if (value !== undefined) headers[name] = Array.isArray(value) ? value.join(', ') : String(value);
  }
  return headers;
}
