import { createHash } from 'node:crypto';

/** Request header with the client's SHA-256 of the body: `<hex>` or `sha256:<hex>`. */
export const CONTENT_HASH_HEADER = 'x-content-hash';

/** Where a client's digest came from. */
export type DigestSource = 'x-content-hash' | 'if-match';

/** A digest the client sent: lower-case hex SHA-256, and the header it came in. */
export interface ClientDigest {
  source: DigestSource;
  hex: string;
}

/** The digests a request carries (none, one or both headers), or why a header is unusable. */
export type ClientDigests = { digests: ClientDigest[] } | { invalid: string };

const HEX_SHA256 = /^[0-9a-f]{64}$/i;
const PREFIX = /^sha-?256:/i;

/** SHA-256 of the bytes as lower-case hex: the content hash of a request body. */
export function sha256Hex(bytes: Uint8Array): string {
  return createHash('sha256').update(bytes).digest('hex');
}

/** `<hex>` or `sha256:<hex>` (prefix also `sha-256:`, any case) → lower-case hex, else undefined. */
function digestText(text: string): string | undefined {
  const hex = text.replace(PREFIX, '');
  return HEX_SHA256.test(hex) ? hex.toLowerCase() : undefined;
}

/** A header sent twice arrives as an array on some platforms; that is never one digest. */
function single(value: string | string[] | undefined): string | undefined | { invalid: string } {
  if (!Array.isArray(value)) return value;
  if (value.length === 1) return value[0];
  return { invalid: 'the header was sent more than once' };
}

/**
 * Reads `X-Content-Hash`: 64 hex digits (any case), optionally prefixed `sha256:`.
 * @returns the lower-case hex, `undefined` when absent, `{ invalid }` otherwise.
 */
export function parseContentHashHeader(value: string | string[] | undefined): string | undefined | { invalid: string } {
  const header = single(value);
  if (header === undefined || typeof header !== 'string') return header;
  const hex = digestText(header.trim());
  return hex ?? { invalid: 'X-Content-Hash must be 64 hex digits of SHA-256, optionally prefixed "sha256:"' };
}

/**
 * Reads a digest from `If-Match`: ONE strong entity tag holding the hex SHA-256, `"<hex>"` or
 * `"sha256:<hex>"`. Refused: weak tags (`W/"..."`: they do not promise identical bytes), `*`,
 * lists of tags, and unquoted values.
 * @returns the lower-case hex, `undefined` when absent, `{ invalid }` otherwise.
 */
export function parseIfMatchDigest(value: string | string[] | undefined): string | undefined | { invalid: string } {
  const header = single(value);
  if (header === undefined || typeof header !== 'string') return header;
  const text = header.trim();
  const quoted = /^"([^"]*)"$/.exec(text);
  const hex = quoted ? digestText(quoted[1]!) : undefined;
  return hex ?? { invalid: 'If-Match must be one strong entity tag holding the SHA-256: "<hex>" or "sha256:<hex>"' };
}

/** Every digest the request's headers carry, or the reason one of them is unusable. */
export function readClientDigests(headers: Record<string, string | string[] | undefined>): ClientDigests {
  const digests: ClientDigest[] = [];
  const fromHeader = parseContentHashHeader(headers[CONTENT_HASH_HEADER]);
  if (typeof fromHeader === 'object') return fromHeader;
  if (fromHeader !== undefined) digests.push({ source: 'x-content-hash', hex: fromHeader });
  const fromIfMatch = parseIfMatchDigest(headers['if-match']);
  if (typeof fromIfMatch === 'object') return fromIfMatch;
  if (fromIfMatch !== undefined) digests.push({ source: 'if-match', hex: fromIfMatch });
  return { digests };
}
