import { HttpException, HttpStatus } from '@nestjs/common';
import { problemDetails, type ErrorFormat } from './problem-details.js';

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

/** The `title` of each code's problem details: the same for every occurrence (RFC 9457). */
const TITLES: Record<IdempotencyErrorCode, string> = {
  IDEMPOTENCY_KEY_MISSING: 'Idempotency key missing',
  IDEMPOTENCY_KEY_INVALID: 'Idempotency key invalid',
  IDEMPOTENCY_IN_PROGRESS: 'Request with this idempotency key in progress',
  IDEMPOTENCY_KEY_REUSED: 'Idempotency key reused with another payload',
  IDEMPOTENCY_STORE_UNAVAILABLE: 'Idempotency store unavailable',
  IDEMPOTENCY_PAYLOAD_UNSUPPORTED: 'Payload cannot be fingerprinted',
  IDEMPOTENCY_RESPONSE_NOT_REPLAYABLE: 'Response not replayable',
  IDEMPOTENCY_USER_UNRESOLVED: 'User unresolved',
};

/**
 * An HTTP answer of the guard. The body (`getResponse()`) is, by `format`, Nest's usual JSON shape
 * plus `code`, `{ statusCode, error, message, code }` (`'nest'`, the default), or RFC 9457
 * problem details, `{ type, title, status, detail, code }` with the message as `detail`
 * (`'problem+json'`). `retryAfterSeconds`, when set, is sent as `Retry-After`.
 */
export class IdempotencyHttpException extends HttpException {
  constructor(
    readonly code: IdempotencyErrorCode,
    status: HttpStatus,
    error: string,
    message: string,
    readonly retryAfterSeconds?: number,
    format: ErrorFormat = 'nest',
  ) {
    super(
      format === 'problem+json' ? problemDetails(code, status, TITLES[code], message) : { statusCode: status, error, message, code },
      status,
    );
    // What logs show, in either format (Nest reads it off a `message` member of the body).
    this.message = message;
  }
}

export const keyMissing = (source: string, format?: ErrorFormat) =>
  new IdempotencyHttpException(
    IdempotencyErrorCode.KEY_MISSING,
    HttpStatus.BAD_REQUEST,
    'Bad Request',
    `This operation needs an idempotency key: send one unique value per operation as ${source} and reuse it on retries.`,
    undefined,
    format,
  );

/** What a caller with an unusable key is told, over HTTP and RPC alike. */
export const keyInvalidMessage = (reason: string) => `The idempotency key is invalid (${reason}): send one key, of 1 to 255 printable characters.`;

export const keyInvalid = (reason: string, format?: ErrorFormat) =>
  new IdempotencyHttpException(IdempotencyErrorCode.KEY_INVALID, HttpStatus.BAD_REQUEST, 'Bad Request', keyInvalidMessage(reason), undefined, format);

export const inProgress = (retryAfterSeconds: number, format?: ErrorFormat) =>
  new IdempotencyHttpException(
    IdempotencyErrorCode.IN_PROGRESS,
    HttpStatus.CONFLICT,
    'Conflict',
    `A request with this idempotency key is still being processed: retry after ${retryAfterSeconds} s with the same key to get its result.`,
    retryAfterSeconds,
    format,
  );

export const keyReused = (format?: ErrorFormat) =>
  new IdempotencyHttpException(
    IdempotencyErrorCode.KEY_REUSED,
    HttpStatus.UNPROCESSABLE_ENTITY,
    'Unprocessable Entity',
    'This idempotency key was already used with a different request payload: send a new key for a new operation.',
    undefined,
    format,
  );

/**
 * 503: the store failed, or (`shuttingDown`) this instance is going away while the store is fine
 * (said as such: "the store is unavailable" sent operators after a healthy Redis, an adversarial
 * helper). One code either way: the client does the same.
 */
export const storeUnavailable = (retryAfterSeconds: number, format?: ErrorFormat, shuttingDown?: boolean) =>
  new IdempotencyHttpException(
    IdempotencyErrorCode.STORE_UNAVAILABLE,
    HttpStatus.SERVICE_UNAVAILABLE,
    'Service Unavailable',
    shuttingDown
      ? `This instance is shutting down, so this operation was not started here: retry after ${retryAfterSeconds} s with the same key.`
      : `The idempotency store is unavailable, so this operation was not started: retry after ${retryAfterSeconds} s with the same key.`,
    retryAfterSeconds,
    format,
  );

export const payloadUnsupported = (reason: string, format?: ErrorFormat) =>
  new IdempotencyHttpException(
    IdempotencyErrorCode.PAYLOAD_UNSUPPORTED,
    HttpStatus.BAD_REQUEST,
    'Bad Request',
    `The request cannot be fingerprinted: ${reason}`,
    undefined,
    format,
  );

export const responseNotReplayable = (reason: string, format?: ErrorFormat) =>
  new IdempotencyHttpException(
    IdempotencyErrorCode.RESPONSE_NOT_REPLAYABLE,
    HttpStatus.CONFLICT,
    'Conflict',
    `A request with this idempotency key already completed, but its response cannot be replayed (${reason}): do not retry; read the resource's current state instead.`,
    undefined,
    format,
  );

export const userUnresolved = (format?: ErrorFormat) =>
  new IdempotencyHttpException(
    IdempotencyErrorCode.USER_UNRESOLVED,
    HttpStatus.INTERNAL_SERVER_ERROR,
    'Internal Server Error',
    'The server cannot tell which user sent this authenticated request, so it cannot guard it against duplicates.',
    undefined,
    format,
  );

/**
 * The guard's HTTP refusals, for entrances of your own (a controller in front of
 * `IdempotentTransactions`, say): the same status, `code`, message and `retryAfterSeconds`
 * (sent as `Retry-After` by the guard; your filter sends it) as the guard's. Each takes the
 * `ErrorFormat` last (default `'nest'`); for `'problem+json'` set the `Content-Type` yourself
 * (`PROBLEM_JSON_CONTENT_TYPE`), as the guard does.
 */
export const IdempotencyRefusals = Object.freeze({ keyMissing, keyInvalid, inProgress, keyReused });
