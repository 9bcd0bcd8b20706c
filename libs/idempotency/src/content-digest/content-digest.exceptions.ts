import { HttpException, HttpStatus } from '@nestjs/common';
import { problemDetails, type ErrorFormat } from '../errors/problem-details.js';

/** Stable, machine-readable codes of `@ContentDigest()`'s HTTP answers. */
export const ContentHashErrorCode = Object.freeze({
  /** 400: the client's digest differs from the SHA-256 of the bytes that arrived. */
  MISMATCH: 'CONTENT_HASH_MISMATCH',
  /** 400: `X-Content-Hash` or `If-Match` is not a usable SHA-256 digest. */
  INVALID: 'CONTENT_HASH_INVALID',
  /** 400: the route requires a digest (`required: true`) and the request has none. */
  MISSING: 'CONTENT_HASH_MISSING',
  /** 415: the body's raw bytes are not available for this content type. */
  UNAVAILABLE: 'CONTENT_HASH_UNAVAILABLE',
  /**
   * 415 (with `Accept-Encoding: identity`): the body came under a `Content-Encoding`. A digest is
   * over the bytes as sent, which a body parser may have decoded before the guard (Express's do).
   */
  ENCODING_UNSUPPORTED: 'CONTENT_HASH_ENCODING_UNSUPPORTED',
});
export type ContentHashErrorCode = (typeof ContentHashErrorCode)[keyof typeof ContentHashErrorCode];

/** The `title` of each code's problem details (RFC 9457). */
const TITLES: Record<ContentHashErrorCode, string> = {
  CONTENT_HASH_MISMATCH: 'Content digest mismatch',
  CONTENT_HASH_INVALID: 'Content digest invalid',
  CONTENT_HASH_MISSING: 'Content digest missing',
  CONTENT_HASH_UNAVAILABLE: 'Body bytes unavailable',
  CONTENT_HASH_ENCODING_UNSUPPORTED: 'Content coding not supported',
};

/**
 * An HTTP answer of `@ContentDigest()`: Nest's usual JSON shape plus `code`
 * (`{ statusCode, error, message, code }`), or with `format` `'problem+json'` RFC 9457 problem
 * details (`{ type, title, status, detail, code }`); for a mismatch, either also holds the
 * `contentHash` the server computed and the `bytes` it hashed, so a client can see what arrived.
 */
export class ContentHashHttpException extends HttpException {
  constructor(
    readonly code: ContentHashErrorCode,
    status: HttpStatus,
    error: string,
    message: string,
    extra: Record<string, unknown> = {},
    format: ErrorFormat = 'nest',
  ) {
    super(
      format === 'problem+json'
        ? problemDetails(code, status, TITLES[code], message, extra)
        : { statusCode: status, error, message, code, ...extra },
      status,
    );
    this.message = message;
  }
}

export const contentHashMismatch = (source: string, contentHash: string, bytes: number, format?: ErrorFormat) =>
  new ContentHashHttpException(
    ContentHashErrorCode.MISMATCH,
    HttpStatus.BAD_REQUEST,
    'Bad Request',
    `The ${source} digest does not match the SHA-256 of the ${bytes} bytes received: send the exact bytes you hashed (no re-encoding, no line-ending changes), or no digest.`,
    { contentHash, bytes },
    format,
  );

export const contentHashInvalid = (reason: string, format?: ErrorFormat) =>
  new ContentHashHttpException(ContentHashErrorCode.INVALID, HttpStatus.BAD_REQUEST, 'Bad Request', `${reason}.`, {}, format);

export const contentHashMissing = (format?: ErrorFormat) =>
  new ContentHashHttpException(
    ContentHashErrorCode.MISSING,
    HttpStatus.BAD_REQUEST,
    'Bad Request',
    'Send the SHA-256 of the body as Content-Digest: sha-256=:<base64>:, X-Content-Hash: <hex> or If-Match: "sha256:<hex>".',
    {},
    format,
  );

export const contentHashUnavailable = (contentType: string, format?: ErrorFormat) =>
  new ContentHashHttpException(
    ContentHashErrorCode.UNAVAILABLE,
    HttpStatus.UNSUPPORTED_MEDIA_TYPE,
    'Unsupported Media Type',
    `This endpoint cannot read ${contentType ? `a body of type ${contentType}` : 'a body without Content-Type'} as bytes: send one of the media types it accepts.`,
    {},
    format,
  );

export const contentHashEncodingUnsupported = (contentEncoding: string, format?: ErrorFormat) =>
  new ContentHashHttpException(
    ContentHashErrorCode.ENCODING_UNSUPPORTED,
    HttpStatus.UNSUPPORTED_MEDIA_TYPE,
    'Unsupported Media Type',
    `This endpoint checks the body's digest over its bytes as sent and cannot see them under Content-Encoding "${contentEncoding}": send the body without Content-Encoding.`,
    {},
    format,
  );
