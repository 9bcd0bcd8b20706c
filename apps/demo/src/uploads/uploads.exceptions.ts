import { BadRequestException, HttpException, HttpStatus, NotFoundException, UnsupportedMediaTypeException } from '@nestjs/common';
import { IdempotencyErrorCode, IdempotencyHttpException } from 'nestjs-idempotency';

/** An HTTP answer with `Retry-After` (the demo's exception filter sends `retryAfterSeconds`). */
class RetryLaterException extends HttpException {
  constructor(
    body: Record<string, unknown>,
    status: HttpStatus,
    readonly retryAfterSeconds: number,
  ) {
    super(body, status);
  }
}

/** Longest reason an answer quotes: the parser's messages quote names from the document, of any length. */
export const MAX_REASON_LENGTH = 200;

/** `text` cut to at most `max` characters (an ellipsis marks the cut), never inside a surrogate pair. */
export const clipText = (text: string, max: number): string => {
  if (text.length <= max) return text;
  let end = max - 1;
  if (/[\uD800-\uDBFF]/.test(text[end - 1] ?? '')) end--;
  return `${text.slice(0, end)}…`;
};

export const invalidXml = (reason: string) =>
  new BadRequestException({
    statusCode: 400,
    error: 'Bad Request',
    code: 'INVALID_XML',
    message: `The document is not acceptable XML: ${clipText(reason, MAX_REASON_LENGTH)}. Fix it and send it again (the same request id may be reused).`,
  });

export const invalidReceipt = (reason: string) =>
  new BadRequestException({
    statusCode: 400,
    error: 'Bad Request',
    code: 'INVALID_RECEIPT',
    message: `The document is not a receipt this service accepts: ${clipText(reason, MAX_REASON_LENGTH)}. Expected <receipt><no>R-1001</no><amount>12.50</amount></receipt>.`,
  });

export const xmlMediaTypeRequired = () =>
  new UnsupportedMediaTypeException({
    statusCode: 415,
    error: 'Unsupported Media Type',
    code: 'UNSUPPORTED_MEDIA_TYPE',
    message: 'Send the document as XML with "Content-Type: application/xml" or "Content-Type: text/xml".',
  });

export const requestIdInvalid = (reason: string) =>
  new IdempotencyHttpException(
    IdempotencyErrorCode.KEY_INVALID,
    HttpStatus.BAD_REQUEST,
    'Bad Request',
    `The request id is invalid (${reason}): send one X-Request-Id (or X-Idempotency-Key) of 1 to 255 printable characters.`,
  );

export const uploadInProgress = (retryAfterSeconds: number) =>
  new IdempotencyHttpException(
    IdempotencyErrorCode.IN_PROGRESS,
    HttpStatus.CONFLICT,
    'Conflict',
    `This upload (the same request id or the same bytes) is still being processed: retry after ${retryAfterSeconds} s to get its result.`,
    retryAfterSeconds,
  );

export const requestIdReused = () =>
  new IdempotencyHttpException(
    IdempotencyErrorCode.KEY_REUSED,
    HttpStatus.UNPROCESSABLE_ENTITY,
    'Unprocessable Entity',
    'This request id was already used for an upload of other content: send a new request id for a new document.',
  );

/** 409 to a late original: its lease ran out and another attempt took the upload over. */
export const uploadSuperseded = () =>
  new RetryLaterException(
    {
      statusCode: 409,
      error: 'Conflict',
      code: 'UPLOAD_SUPERSEDED',
      message:
        'This attempt took longer than its lease and another attempt took the upload over; nothing was stored by this one. Retry with the same request id to get the upload\'s result.',
    },
    HttpStatus.CONFLICT,
    1,
  );

export const uploadNotFound = () =>
  new NotFoundException({
    statusCode: 404,
    error: 'Not Found',
    code: 'UPLOAD_NOT_FOUND',
    message: 'No upload with this id exists.',
  });
