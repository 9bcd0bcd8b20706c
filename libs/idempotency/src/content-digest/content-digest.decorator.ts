import {
  SetMetadata,
  UseGuards,
  applyDecorators,
  createParamDecorator,
  type ExecutionContext,
} from '@nestjs/common';
import { IdempotencyConfigError } from '../errors/idempotency.errors.js';
import {
  CONTENT_DIGEST_METADATA,
  ContentDigestGuard,
  type ContentDigestOptions,
  type ContentHashedRequest,
} from './content-digest.guard.js';

/**
 * Verifies or computes the SHA-256 of the request body's raw bytes, on a method or a
 * controller class. The client may send its digest as `X-Content-Hash: <hex>` or
 * `X-Content-Hash: sha256:<hex>`, or as `If-Match: "<hex>"` / `If-Match: "sha256:<hex>"`
 * (one strong entity tag); hex in any case. A digest that differs from the bytes received is
 * answered 400 `CONTENT_HASH_MISMATCH`; without a digest the server computes it (unless
 * `required`). The handler reads it with `@ContentHash()` (or `request.contentHash`).
 *
 * Needs the bytes as received, which a raw parser for the route's content types hands it as the
 * body (a Buffer): Express `app.useBodyParser('raw', { type: ['application/xml'] })`, Fastify
 * `app.useBodyParser(['application/xml'])`. No app-wide `rawBody: true` is needed for that; it
 * is used when set, and is the only way to the bytes of a JSON body (whose parser keeps none).
 * A text parser's string is not bytes: answered 415. Check the content type before this guard
 * (a controller-level guard runs first) so that other types get your own 415. A body under a
 * `Content-Encoding` (gzip, br, ...) is answered 415 `CONTENT_HASH_ENCODING_UNSUPPORTED`: the
 * digest is over the bytes as sent, which Express's parsers decode before any guard.
 *
 * @example
 * ```ts
 * @Post('xml')
 * @ContentDigest()
 * upload(@ContentHash() contentHash: string, @Body() xml: Buffer) { ... }
 * ```
 */
export function ContentDigest(options: ContentDigestOptions = {}): ClassDecorator & MethodDecorator {
  return applyDecorators(SetMetadata(CONTENT_DIGEST_METADATA, options), UseGuards(ContentDigestGuard));
}

/**
 * The request body's SHA-256 (lower-case hex) that `@ContentDigest()` checked or computed.
 * Throws `IdempotencyConfigError` on a route without `@ContentDigest()`.
 */
export const ContentHash = createParamDecorator((_data: unknown, context: ExecutionContext): string => {
  const { contentHash } = context.switchToHttp().getRequest<ContentHashedRequest>();
  if (contentHash === undefined) {
    throw new IdempotencyConfigError('@ContentHash() needs @ContentDigest() on the route (or its controller)');
  }
  return contentHash;
});
