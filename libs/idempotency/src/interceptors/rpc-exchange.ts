import { StreamableFile, type CallHandler, type ExecutionContext } from '@nestjs/common';
import { Readable } from 'node:stream';
import { isObservable, of, type Observable } from 'rxjs';
import { IdempotencyError } from '../errors/idempotency.errors.js';
import { IdempotencyErrorCode, IdempotencyHttpException } from '../errors/idempotency-http.exceptions.js';
import { fingerprintRequest } from '../keys/fingerprint.js';
import type { KeyOwner } from '../keys/storage-key.js';
import type { SavedResponse } from '../stores/idempotency-store.js';
import type { GuardExchange, GuardRefusal, OwnedKey } from './guard-exchange.js';
import type { GuardedRoute } from './guarded-route.js';
import { runOwned } from './owned-run.js';

/** `@nestjs/microservices` marks `@EventPattern` handlers with this (PatternHandler.EVENT). */
const HANDLER_TYPE_METADATA = 'microservices:handler_type';
const EVENT_HANDLER = 2;

type RpcExceptionClass = new (error: object) => Error;
let rpcException: Promise<RpcExceptionClass> | undefined;

/**
 * A message to a `@MessagePattern` (request-response) or `@EventPattern` handler. Messages have
 * no user: the owner segment of their keys is empty (an HTTP owner never is). A duplicate
 * message gets the saved result; a duplicate event is dropped (the handler does not run).
 * Refusals of messages are `RpcException`s with `{ code, message }`. The saved result is the
 * handler's first value as JSON text, saved before it is sent on; a result JSON cannot hold (a
 * stream, a BigInt) is not kept, and the key is released.
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

  run(next: CallHandler, owned: OwnedKey): Observable<unknown> {
    return runOwned(
      next.handle(),
      {
        succeeded: async (value) => {
          const body = serialize(value);
          if (body === null) return owned.release();
          return owned.save(body === undefined ? { statusCode: 0, headers: {} } : { statusCode: 0, headers: {}, body });
        },
        failed: () => owned.release(),
      },
      owned.leaseMs,
    );
  }

  replay(saved: SavedResponse): Observable<unknown> {
    if (saved.unreplayable) {
      if (this.isEvent) return of(undefined);
      throw new this.RpcException({
        code: IdempotencyErrorCode.RESPONSE_NOT_REPLAYABLE,
        message: 'A message with this key was already handled, but its result was not kept.',
      });
    }
    return of(saved.body === undefined ? undefined : JSON.parse(saved.body));
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

/** The result as JSON text: undefined for no value, null when JSON cannot hold it. */
function serialize(value: unknown): string | undefined | null {
  if (value === undefined) return undefined;
  if (!isJsonable(value)) return null;
  try {
    return JSON.stringify(value);
  } catch {
    return null; // BigInt, cycles
  }
}

function isJsonable(value: unknown): boolean {
  if (value === null || typeof value !== 'object') return typeof value !== 'function' && typeof value !== 'symbol';
  return !(
    value instanceof StreamableFile ||
    value instanceof Readable ||
    value instanceof ReadableStream ||
    Buffer.isBuffer(value) ||
    ArrayBuffer.isView(value) ||
    isObservable(value) ||
    Symbol.asyncIterator in value
  );
}
