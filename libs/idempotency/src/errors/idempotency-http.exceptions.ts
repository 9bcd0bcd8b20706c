import { HttpException, HttpStatus } from '@nestjs/common';

/** Stable, machine-readable codes of the guard's HTTP answers. */
export const IdempotencyErrorCode = Object.freeze({
  KEY_MISSING: 'IDEMPOTENCY_KEY_MISSING',
  KEY_INVALID: 'IDEMPOTENCY_KEY_INVALID',
  IN_PROGRESS: 'IDEMPOTENCY_IN_PROGRESS',
  KEY_REUSED: 'IDEMPOTENCY_KEY_REUSED',
  STORE_UNAVAILABLE: 'IDEMPOTENCY_STORE_UNAVAILABLE',
  PAYLOAD_UNSUPPORTED: 'IDEMPOTENCY_PAYLOAD_UNSUPPORTED',
  RESPONSE_NOT_REPLAYABLE: 'IDEMPOTENCY_RESPONSE_NOT_REPLAYABLE',
  USER_UNRESOLVED: 'IDEMPOTENCY_USER_UNRESOLVED',
});
export type IdempotencyErrorCode = (typeof IdempotencyErrorCode)[keyof typeof IdempotencyErrorCode];

/**
 * An HTTP answer of the guard. The body is Nest's usual JSON shape plus `code`:
 * `{ statusCode, error, message, code }`. `retryAfterSeconds`, when set, is sent as `Retry-After`.
 */
export class IdempotencyHttpException extends HttpException {
  constructor(
    readonly code: IdempotencyErrorCode,
    status: HttpStatus,
    error: string,
    message: string,
    readonly retryAfterSeconds?: number,
  ) {
    super({ statusCode: status, error, message, code }, status);
  }
}

export const keyMissing = (source: string) =>
  new IdempotencyHttpException(
    IdempotencyErrorCode.KEY_MISSING,
    HttpStatus.BAD_REQUEST,
    'Bad Request',
    `This operation needs an idempotency key: send one unique value per operation as ${source} and reuse it on retries.`,
  );

/** What a caller with an unusable key is told, over HTTP and RPC alike. */
export const keyInvalidMessage = (reason: string) => `The idempotency key is invalid (${reason}): use 1 to 255 printable characters.`;

export const keyInvalid = (reason: string) =>
  new IdempotencyHttpException(IdempotencyErrorCode.KEY_INVALID, HttpStatus.BAD_REQUEST, 'Bad Request', keyInvalidMessage(reason));

export const inProgress = (retryAfterSeconds: number) =>
  new IdempotencyHttpException(
    IdempotencyErrorCode.IN_PROGRESS,
    HttpStatus.CONFLICT,
    'Conflict',
    `A request with this idempotency key is still being processed: retry after ${retryAfterSeconds} s with the same key to get its result.`,
    retryAfterSeconds,
  );

export const keyReused = () =>
  new IdempotencyHttpException(
    IdempotencyErrorCode.KEY_REUSED,
    HttpStatus.UNPROCESSABLE_ENTITY,
    'Unprocessable Entity',
    'This idempotency key was already used with a different request payload: send a new key for a new operation.',
  );

export const storeUnavailable = (retryAfterSeconds: number) =>
  new IdempotencyHttpException(
    IdempotencyErrorCode.STORE_UNAVAILABLE,
    HttpStatus.SERVICE_UNAVAILABLE,
    'Service Unavailable',
    `The idempotency store is unavailable, so this operation was not started: retry after ${retryAfterSeconds} s with the same key.`,
    retryAfterSeconds,
  );

export const payloadUnsupported = (reason: string) =>
  new IdempotencyHttpException(
    IdempotencyErrorCode.PAYLOAD_UNSUPPORTED,
    HttpStatus.BAD_REQUEST,
    'Bad Request',
    `The request cannot be fingerprinted (${reason}): send a flatter payload.`,
  );

export const responseNotReplayable = (reason: string) =>
  new IdempotencyHttpException(
    IdempotencyErrorCode.RESPONSE_NOT_REPLAYABLE,
    HttpStatus.CONFLICT,
    'Conflict',
    `A request with this idempotency key already completed, but its response cannot be replayed (${reason}): do not retry; read the resource's current state instead.`,
  );

export const userUnresolved = () =>
  new IdempotencyHttpException(
    IdempotencyErrorCode.USER_UNRESOLVED,
    HttpStatus.INTERNAL_SERVER_ERROR,
    'Internal Server Error',
    'The server cannot tell which user sent this authenticated request, so it cannot guard it against duplicates.',
  );

/**
 * The guard's HTTP refusals, for entrances of your own (a controller in front of
 * `IdempotentTransactions`, say): the same status, `code`, message and `retryAfterSeconds`
 * (sent as `Retry-After` by the guard; your filter sends it) as the guard's.
 */
export const IdempotencyRefusals = Object.freeze({ keyMissing, keyInvalid, inProgress, keyReused });
