import { Inject, Injectable, Logger, Optional, type CanActivate, type ExecutionContext } from '@nestjs/common';
import { HttpAdapterHost, Reflector } from '@nestjs/core';
import { PROBLEM_JSON_CONTENT_TYPE, type ErrorFormat } from '../errors/problem-details.js';
import { IDEMPOTENCY_RESOLVED_OPTIONS, type ResolvedIdempotencyOptions } from '../idempotency.config.js';
import { readClientDigests, sha256Hex, type DigestSource } from './content-digest.js';

/** Each digest header as the client wrote it, for the messages. */
const HEADER_NAMES: Record<DigestSource, string> = {
  'x-content-hash': 'X-Content-Hash',
  'if-match': 'If-Match',
  'content-digest': 'Content-Digest',
};
import {
  contentHashEncodingUnsupported,
  contentHashInvalid,
  contentHashMismatch,
  contentHashMissing,
  contentHashUnavailable,
  type ContentHashHttpException,
} from './content-digest.exceptions.js';

/** Metadata key under which `@ContentDigest()` stores its options. */
export const CONTENT_DIGEST_METADATA = 'idempotency:content-digest';

/** Options of `@ContentDigest()`. */
export interface ContentDigestOptions {
  /**
   * Refuse a request that carries no digest with 400 `CONTENT_HASH_MISSING`. Default `false`:
   * without a digest the server computes one, and only a digest that is sent is checked.
   */
  required?: boolean;
  /**
   * How this route's refusals are written: `'nest'` or `'problem+json'` (RFC 9457, sent as
   * `application/problem+json`). Default: the `IdempotencyModule`'s `errorFormat` when the module
   * is in scope (global, or imported where the controller is), else `'nest'`.
   */
  errorFormat?: ErrorFormat;
}

/** The request as the guard reads it (Express and Fastify both have these). */
export interface ContentHashedRequest {
  headers: Record<string, string | string[] | undefined>;
  /** What the body parser made: a Buffer from a raw parser is the bytes as received. */
  body?: unknown;
  /** The body bytes as received: Nest sets it with `rawBody: true` for the parsers it registers. */
  rawBody?: Buffer;
  /** Set by the guard: lower-case hex SHA-256 of the body bytes, checked against the client's digest. */
  contentHash?: string;
}

/** The body bytes as received: `rawBody` when Nest kept it, else a Buffer a raw parser made. Never a decoded string or a parsed object. */
function receivedBytes(request: ContentHashedRequest): Uint8Array | undefined {
  if (Buffer.isBuffer(request.rawBody)) return request.rawBody;
  return request.body instanceof Uint8Array ? request.body : undefined;
}

const hasBody = (headers: ContentHashedRequest['headers']): boolean =>
  headers['transfer-encoding'] !== undefined || Number(headers['content-length'] ?? 0) > 0;

/**
 * The request's content codings other than `identity` (`gzip`, `br`, ...), as sent; empty when
 * the body is the content as is. Under a coding, the bytes the guard finds may be the decoded
 * ones: Express's body parsers inflate gzip, deflate and br before any guard (`rawBody` too),
 * Fastify's parsers hand over the coded bytes, and `@fastify/compress` may decode them.
 */
function contentCodings(headers: ContentHashedRequest['headers']): string {
  const header = headers['content-encoding'];
  const codings = (Array.isArray(header) ? header.join(',') : (header ?? '')).split(',').map((coding) => coding.trim());
  return codings.some((coding) => coding !== '' && coding.toLowerCase() !== 'identity') ? codings.filter(Boolean).join(', ') : '';
}

/**
 * The guard behind `@ContentDigest()`. Computes SHA-256 over the bytes as received: the Buffer
 * a raw parser made the body (Express `app.useBodyParser('raw', { type })`, Fastify
 * `app.useBodyParser(types)`), or `request.rawBody` when the app keeps it (`rawBody: true`);
 * never a decoded string or a parsed object. Compares it with every digest the client sent
 * (`X-Content-Hash`, `If-Match`, `Content-Digest`) and sets `request.contentHash`. Answers 400
 * `CONTENT_HASH_MISMATCH` / `CONTENT_HASH_INVALID` / `CONTENT_HASH_MISSING`, 415
 * `CONTENT_HASH_UNAVAILABLE` when a body arrived without its bytes (no raw parser for its
 * content type; also logged once, naming the parser), and 415 `CONTENT_HASH_ENCODING_UNSUPPORTED`
 * (with `Accept-Encoding: identity`) for a body under a `Content-Encoding`: a digest is over the
 * bytes as sent, and the bytes found may be decoded ones.
 */
@Injectable()
export class ContentDigestGuard implements CanActivate {
  private readonly logger = new Logger('ContentDigest');
  private warned = false;

  constructor(
    private readonly reflector: Reflector,
    @Optional() private readonly adapterHost?: HttpAdapterHost,
    /** The IdempotencyModule's options, when it is in scope: their `errorFormat` is the default. */
    @Optional() @Inject(IDEMPOTENCY_RESOLVED_OPTIONS) private readonly defaults?: ResolvedIdempotencyOptions,
  ) {}

  canActivate(context: ExecutionContext): boolean {
    if (context.getType() !== 'http') return true;
    const options =
      this.reflector.getAllAndOverride<ContentDigestOptions | undefined>(CONTENT_DIGEST_METADATA, [
        context.getHandler(),
        context.getClass(),
      ]) ?? {};
    const request = context.switchToHttp().getRequest<ContentHashedRequest>();
    const format = options.errorFormat ?? this.defaults?.errorFormat ?? 'nest';

    const sent = readClientDigests(request.headers);
    if ('invalid' in sent) throw this.refusal(context, format, contentHashInvalid(sent.invalid, format));
    if (sent.digests.length === 0 && options.required) throw this.refusal(context, format, contentHashMissing(format));

    // Refused rather than checked: the same request would pass on one adapter and fail on the other.
    const codings = contentCodings(request.headers);
    if (codings) throw this.refusal(context, format, contentHashEncodingUnsupported(codings, format), { 'Accept-Encoding': 'identity' });

    let bytes = receivedBytes(request);
    if (!bytes) {
      if (hasBody(request.headers)) throw this.refusal(context, format, this.unavailable(request, format));
      bytes = Buffer.alloc(0);
    }
    const contentHash = sha256Hex(bytes);
    for (const digest of sent.digests) {
      const source = HEADER_NAMES[digest.source];
      if (digest.hex !== contentHash) throw this.refusal(context, format, contentHashMismatch(source, contentHash, bytes.length, format));
    }
    request.contentHash = contentHash;
    return true;
  }

  /** Problem details go out under their media type, whichever exception filter sends them; `headers` go with either format. */
  private refusal(
    context: ExecutionContext,
    format: ErrorFormat,
    exception: ContentHashHttpException,
    headers: Record<string, string> = {},
  ): ContentHashHttpException {
    const adapter = this.adapterHost?.httpAdapter;
    if (!adapter) return exception;
    const response: unknown = context.switchToHttp().getResponse();
    if (format === 'problem+json') adapter.setHeader(response, 'Content-Type', PROBLEM_JSON_CONTENT_TYPE);
    for (const [name, value] of Object.entries(headers)) adapter.setHeader(response, name, value);
    return exception;
  }

  private unavailable(request: ContentHashedRequest, format: ErrorFormat) {
    const contentType = String(request.headers['content-type'] ?? '');
    if (!this.warned) {
      this.warned = true;
      const parsed = request.body === undefined ? 'no parser read it' : `its parser made a ${typeof request.body}, not bytes`;
      this.logger.warn(
        `No raw bytes for a "${contentType}" body on a @ContentDigest route (${parsed}). If this type should be accepted, ` +
          `register a raw parser for it, which hands the route a Buffer (Express app.useBodyParser('raw', { type: [...] }), ` +
          `Fastify app.useBodyParser([...])), or create the app with { rawBody: true } (JSON bodies: their parser keeps no bytes otherwise).`,
      );
    }
    return contentHashUnavailable(contentType, format);
  }
}
