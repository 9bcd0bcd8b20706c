import { Injectable, Logger, type CanActivate, type ExecutionContext } from '@nestjs/common';
import { Reflector } from '@nestjs/core';
import { readClientDigests, sha256Hex, type DigestSource } from './content-digest.js';

/** Each digest header as the client wrote it, for the messages. */
const HEADER_NAMES: Record<DigestSource, string> = {
  'x-content-hash': 'X-Content-Hash',
  'if-match': 'If-Match',
  'content-digest': 'Content-Digest',
};
import {
  contentHashInvalid,
  contentHashMismatch,
  contentHashMissing,
  contentHashUnavailable,
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
}

/** The request as the guard reads it (Express and Fastify both have these). */
export interface ContentHashedRequest {
  headers: Record<string, string | string[] | undefined>;
  /** The body bytes as received: Nest sets it with `rawBody: true` for the parsers it registers. */
  rawBody?: Buffer;
  /** Set by the guard: lower-case hex SHA-256 of `rawBody`, checked against the client's digest. */
  contentHash?: string;
}

const hasBody = (headers: ContentHashedRequest['headers']): boolean =>
  headers['transfer-encoding'] !== undefined || Number(headers['content-length'] ?? 0) > 0;

/**
 * The guard behind `@ContentDigest()`. Computes SHA-256 over `request.rawBody` (the bytes as
 * received, never a parsed body), compares it with every digest the client sent
 * (`X-Content-Hash`, `If-Match`) and sets `request.contentHash`. Answers 400
 * `CONTENT_HASH_MISMATCH` / `CONTENT_HASH_INVALID` / `CONTENT_HASH_MISSING`, and 415
 * `CONTENT_HASH_UNAVAILABLE` when a body arrived but no raw bytes were kept (no raw-body
 * parser for its content type; also logged, since `rawBody: true` may be missing).
 */
@Injectable()
export class ContentDigestGuard implements CanActivate {
  private readonly logger = new Logger('ContentDigest');
  private warned = false;

  constructor(private readonly reflector: Reflector) {}

  canActivate(context: ExecutionContext): boolean {
    if (context.getType() !== 'http') return true;
    const options =
      this.reflector.getAllAndOverride<ContentDigestOptions | undefined>(CONTENT_DIGEST_METADATA, [
        context.getHandler(),
        context.getClass(),
      ]) ?? {};
    const request = context.switchToHttp().getRequest<ContentHashedRequest>();

    const sent = readClientDigests(request.headers);
    if ('invalid' in sent) throw contentHashInvalid(sent.invalid);
    if (sent.digests.length === 0 && options.required) throw contentHashMissing();

    let bytes = request.rawBody;
    if (!Buffer.isBuffer(bytes)) {
      if (hasBody(request.headers)) throw this.unavailable(request);
      bytes = Buffer.alloc(0);
    }
    const contentHash = sha256Hex(bytes);
    for (const digest of sent.digests) {
      const source = HEADER_NAMES[digest.source];
      if (digest.hex !== contentHash) throw contentHashMismatch(source, contentHash, bytes.length);
    }
    request.contentHash = contentHash;
    return true;
  }

  private unavailable(request: ContentHashedRequest) {
    const contentType = String(request.headers['content-type'] ?? '');
    if (!this.warned) {
      this.warned = true;
      this.logger.warn(
        `No request.rawBody for a "${contentType}" body: if this type should be accepted, create the app with ` +
          `{ rawBody: true } and register a body parser for it (app.useBodyParser(...)).`,
      );
    }
    return contentHashUnavailable(contentType);
  }
}
