import { createHash } from 'node:crypto';

/** Request header with the client's SHA-256 of the body: `<hex>` or `sha256:<hex>`. */
export const CONTENT_HASH_HEADER = 'x-content-hash';

/** RFC 9530 request header: a dictionary of digests, e.g. `sha-256=:<base64>:`. */
export const CONTENT_DIGEST_HEADER = 'content-digest';

/** Where a client's digest came from. */
export type DigestSource = 'x-content-hash' | 'if-match' | 'content-digest';

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

/** One member of a structured-field dictionary whose value is a byte sequence: `name=:base64:` and parameters. */
const BYTES_MEMBER = /^([a-z*][a-z0-9_.*-]*)=:([A-Za-z0-9+/]*={0,2}):(?:;.*)?$/;

/**
 * The members of a structured-field dictionary (RFC 8941), split on the commas between them: not
 * on a comma inside a string parameter (`;note="a,b"`). Undefined when a string is unterminated.
 */
function dictionaryMembers(header: string): string[] | undefined {
  const members: string[] = [];
  let start = 0;
  let inString = false;
  for (let i = 0; i < header.length; i++) {
    const char = header[i];
    if (inString && char === '\\') i++;
    else if (char === '"') inString = !inString;
    else if (char === ',' && !inString) {
      members.push(header.slice(start, i).trim());
      start = i + 1;
    }
  }
  if (inString) return undefined;
  members.push(header.slice(start).trim());
  return members;
}

/**
 * Reads RFC 9530 `Content-Digest`: a structured-field dictionary of algorithm = byte sequence,
 * e.g. `sha-512=:...:, sha-256=:<base64>:`. Its `sha-256` member is used; other algorithms are
 * ignored, as the RFC allows. Refused: a member that is not `name=:base64:` (parameters may
 * follow), no `sha-256` member, two of them, and a digest that is not 32 bytes in canonical
 * base64. The header sent on several lines is one dictionary, their values joined by commas
 * (RFC 8941 4.2, and what Node.js does), so two lines with a `sha-256` each are refused too.
 * Written here rather than with a structured-fields library: the package has no runtime
 * dependency, and only this one member type is read.
 * @returns the lower-case hex, `undefined` when absent, `{ invalid }` otherwise.
 */
export function parseContentDigestHeader(value: string | string[] | undefined): string | undefined | { invalid: string } {
  if (value === undefined) return undefined;
  const header = Array.isArray(value) ? value.join(', ') : value;
  const invalid = { invalid: 'Content-Digest must carry one sha-256 digest as sha-256=:<base64 of the 32 bytes>:' };
  const sha256: string[] = [];
  for (const member of dictionaryMembers(header) ?? ['']) {
    const parsed = BYTES_MEMBER.exec(member);
    if (!parsed) return invalid;
    if (parsed[1] === 'sha-256') sha256.push(parsed[2]!);
  }
  if (sha256.length !== 1) return invalid;
  const bytes = Buffer.from(sha256[0]!, 'base64');
  return bytes.length === 32 && bytes.toString('base64') === sha256[0] ? bytes.toString('hex') : invalid;
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
  const fromDigest = parseContentDigestHeader(headers[CONTENT_DIGEST_HEADER]);
  if (typeof fromDigest === 'object') return fromDigest;
  if (fromDigest !== undefined) digests.push({ source: 'content-digest', hex: fromDigest });
  return { digests };
}
