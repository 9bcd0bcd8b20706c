import type { ExecutionContext } from '@nestjs/common';
import { of, type Observable } from 'rxjs';
import { IdempotencyError } from '../errors/idempotency.errors.js';
import { IdempotencyErrorCode, IdempotencyHttpException } from '../errors/idempotency-http.exceptions.js';
import { fingerprintRequest } from '../keys/fingerprint.js';
import type { KeyOwner } from '../keys/storage-key.js';
import type { SavedResponse } from '../stores/idempotency-store.js';
import { deserialize, serialize, type GuardExchange, type GuardRefusal } from './guard-exchange.js';
import type { GuardedRoute } from './guarded-route.js';
import { isReplayable } from './http-exchange.js';

/** `@nestjs/microservices` marks `@EventPattern` handlers with this (PatternHandler.EVENT). */
const HANDLER_TYPE_METADATA = 'microservices:handler_type';
const EVENT_HANDLER = 2;

type RpcExceptionClass = new (error: object) => Error;
let rpcException: Promise<RpcExceptionClass> | undefined;

/**
 * A message to a `@MessagePattern` (request-response) or `@EventPattern` handler. Messages have
 * no user: the owner segment of their keys is empty (an HTTP owner never is). A duplicate
 * message gets the saved result; a duplicate event is dropped (the handler does not run).
 * Refusals of messages are `RpcException`s with `{ code, message }`.
 */
export class RpcExchange implements GuardExchange {
  readonly owner: KeyOwner = { id: '' };
  readonly fingerprint: string;
  private readonly isEvent: boolean;

  private constructor(
    ctx: ExecutionContext,
    route: GuardedRoute,
    readonly clientKey: string | undefined,
    private readonly RpcException: RpcExceptionClass,
  ) {
    this.isEvent = Reflect.getMetadata(HANDLER_TYPE_METADATA, ctx.getHandler()) === EVENT_HANDLER;
    try {
      const message = { method: 'RPC', path: route.handler, body: ctx.switchToRpc().getData() };
      this.fingerprint = fingerprintRequest(message, route.ignoreFields);
    } catch (error) {
      if (!(error instanceof IdempotencyError)) throw error;
      throw new this.RpcException({ code: IdempotencyErrorCode.PAYLOAD_UNSUPPORTED, message: error.message });
    }
  }

  /** `readKey` may throw the guard's HTTP exception for an invalid key: it becomes an RpcException. */
  static async create(ctx: ExecutionContext, route: GuardedRoute, readKey: () => string | undefined): Promise<RpcExchange> {
    rpcException ??= import('@nestjs/microservices').then((m) => m.RpcException as RpcExceptionClass);
    const RpcException = await rpcException;
    let clientKey: string | undefined;
    try {
      clientKey = readKey();
    } catch (error) {
      if (!(error instanceof IdempotencyHttpException)) throw error;
      throw new RpcException({ code: error.code, message: error.message });
    }
    return new RpcExchange(ctx, route, clientKey, RpcException);
  }

  replay(saved: SavedResponse): unknown {
    return deserialize(saved);
  }

  capture(value: unknown): SavedResponse | null {
    const body = isReplayable(value) ? serialize(value) : null;
    return body === null ? null : { statusCode: 0, headers: {}, body };
  }

  refuse(refusal: GuardRefusal): Observable<unknown> {
    if (this.isEvent && (refusal.reason === 'in_progress' || refusal.reason === 'key_reused')) return of(undefined);
    throw new this.RpcException(toRpcError(refusal));
  }
}

function toRpcError(refusal: GuardRefusal): { code: string; message: string; retryAfterMs?: number } {
  switch (refusal.reason) {
    case 'key_missing':
      return { code: IdempotencyErrorCode.KEY_MISSING, message: `The message has no idempotency key (${refusal.source}).` };
    case 'in_progress':
      return {
        code: IdempotencyErrorCode.IN_PROGRESS,
        message: 'A message with this key is still being processed: send it again later.',
        retryAfterMs: refusal.retryAfterMs,
      };
    case 'key_reused':
      return { code: IdempotencyErrorCode.KEY_REUSED, message: 'This key was already used with another payload.' };
    case 'store_unavailable':
      return { code: IdempotencyErrorCode.STORE_UNAVAILABLE, message: 'The idempotency store is unavailable.' };
  }
}
