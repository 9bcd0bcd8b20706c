import { createHash, hash, type Hash } from 'node:crypto';
import { IdempotencyError } from '../errors/idempotency.errors.js';
import { CanonicalWriter, MAX_CANONICAL_DEPTH, type CanonicalSink } from './canonical-writer.js';

export { MAX_CANONICAL_DEPTH };

let idle: CanonicalWriter | undefined = new CanonicalWriter();

/**
 * Runs `write` with a free writer bound to `sink`, then flushes. The shared writer is reused;
 * a fresh one is made if it is busy (a `toJSON` that fingerprints re-enters).
 */
function writeCanonical(
  sink: CanonicalSink,
  ignored: ReadonlySet<string> | undefined,
  write: (writer: CanonicalWriter) => void,
): void {
  const writer = idle ?? new CanonicalWriter();
  idle = undefined;
  try {
    writer.begin(sink, ignored);
    write(writer);
    writer.end();
  } finally {
    idle = writer;
  }
}

/**
 * Canonical JSON of a value: the text `JSON.stringify` would give, except that object keys are
 * sorted at every depth (plain UTF-16 code-unit order) and keys in `ignoreFields` are removed at
 * every depth, in objects inside arrays too. Arrays keep their order.
 *
 * Null versus absent: a property whose value is `undefined` (or a function or symbol) is omitted,
 * exactly as if it were absent, as in JSON; `null` is a value, so `{"a":null}` differs from `{}`.
 * In arrays such values become `null`, as in JSON. Non-finite numbers (what JSON.parse makes of
 * `1e400`) become `Infinity`, `-Infinity` or `NaN`, never `null`, which they are not; a bigint
 * becomes its digits; `toJSON()` is honoured (Dates, nested Buffers).
 *
 * Input must be acyclic, as anything a body parser made is; nesting deeper than
 * {@link MAX_CANONICAL_DEPTH} throws `IdempotencyError`.
 *
 * @returns the text, or `undefined` for a top-level value JSON cannot represent (undefined).
 */
export function canonicalJson(value: unknown, ignoreFields?: ReadonlySet<string>): string | undefined {
  const chunks: Buffer[] = [];
  const collect = (data: Uint8Array | string) =>
    chunks.push(typeof data === 'string' ? Buffer.from(data, 'utf8') : Buffer.from(data));
  let written = false;
  writeCanonical({ update: collect }, ignoreFields, (w) => {
    written = w.value(value);
  });
  return written ? Buffer.concat(chunks).toString('utf8') : undefined;
}

/**
 * SHA-256 that hashes a single chunk with the one-shot `crypto.hash` (about 0.3 µs for a small
 * request, where a `Hash` object costs about 1 µs) and streams into a `Hash` from the second
 * chunk on (large bodies, raw bytes). The canonical writer flushes once for a small value.
 */
class Sha256Sink implements CanonicalSink {
  private first: Uint8Array | string | undefined;
  private streaming: Hash | undefined;

  update(data: Uint8Array | string): void {
    if (this.streaming) {
      this.streaming.update(data);
    } else if (this.first === undefined) {
      // A copy: the writer reuses its buffer after a flush.
      this.first = typeof data === 'string' ? data : Buffer.from(data);
    } else {
      this.streaming = createHash('sha256').update(this.first).update(data);
      this.first = undefined;
    }
  }

  hex(): string {
    return this.streaming ? this.streaming.digest('hex') : hash('sha256', this.first ?? '', 'hex');
  }
}

/** The parts of a request that make up its fingerprint. */
export interface FingerprintInput {
  /** HTTP method, any case. */
  method: string;
  /** The route path. */
  path: string;
  /** Parsed query; absent hashes like `null`. `ignoreFields` removes its fields. */
  query?: unknown;
  /**
   * The route's path parameters (an HTTP route's). Where `params` or `hosts` is given, they and
   * the query are hashed as one object `{ hosts, params, query }` in place of the query;
   * `ignoreFields` never removes them, nor that object's names: they are the route.
   */
  params?: unknown;
  /** A host-bound route's host: its host parameters, or its host name (see `params`). */
  hosts?: unknown;
  /**
   * The query string as sent, where its parser may have lost part of it (see
   * `httpFingerprintInput`): hashed with `params` and the query, as `queryAsSent`.
   */
  queryAsSent?: string;
  /**
   * The body as the body parser handed it to the route. A Buffer (or other Uint8Array) is hashed
   * as its bytes; a string under a non-JSON `Content-Type` (a text parser) as its UTF-8 bytes.
   */
  body?: unknown;
  /** The body bytes as received (Nest's `rawBody: true`); hashed instead of `body` when the body is not JSON. */
  rawBody?: Buffer;
  /** The request's `Content-Type` header. */
  contentType?: string;
  /**
   * The request carries a body (`Content-Length` over 0, or `Transfer-Encoding`). With neither
   * `body` nor `rawBody`, no parser read it: refused, never hashed as an absent body.
   */
  hasBody?: boolean;
  /** The files of a multipart upload (multer's `req.file` and `req.files`), in order. */
  files?: readonly FingerprintFile[];
}

/** One uploaded file, as the fingerprint covers it: its form field, name, type and bytes. */
export interface FingerprintFile {
  /** The form field it came in. */
  field: string;
  /** The file name the client gave. */
  name: string;
  /** The media type the client gave. */
  type: string;
  /** Its size in bytes. */
  size: number;
  /** Lower-case hex SHA-256 of its bytes. */
  sha256: string;
}

/** True for `application/json` and any `+json` media type (parameters ignored). */
export function isJsonContentType(contentType: string): boolean {
  const end = contentType.indexOf(';');
  const type = (end === -1 ? contentType : contentType.slice(0, end)).trim().toLowerCase();
  return type === 'application/json' || type.endsWith('+json');
}

/**
 * The body as bytes, or undefined when it is hashed as JSON (or is absent). A Buffer is its
 * bytes. A string that is not JSON is the raw bytes when Nest kept them, else its UTF-8 bytes:
 * the bytes that arrived whenever they were UTF-8 text (see `fingerprintRequest`). A parsed value
 * is JSON, but a form is its raw bytes when Nest kept them.
 */
function bytesOf(input: FingerprintInput): Uint8Array | string | undefined {
  const { body, rawBody } = input;
  if (body instanceof Uint8Array) return body;
  if (body === undefined) return rawBody;
  if (input.contentType === undefined || isJsonContentType(input.contentType)) return undefined;
  if (typeof body === 'string') {
    if (rawBody) return rawBody;
    // U+FFFD stands for any bytes that were not valid text: two different bodies would be one.
    if (body.includes('\uFFFD')) throw undecodableText(input.contentType);
    return body;
  }
  // JSON under another type (`application/csp-report`) is JSON with rawBody or without.
  return rawBody && !isJsonText(rawBody) ? rawBody : undefined;
}

/**
 * Whether the string holds no lone surrogate (Node 20's `String.prototype.isWellFormed`, ES2024).
 * UTF-8 has no encoding for one: each becomes the bytes of U+FFFD, so that text a parser decoded
 * from UTF-16 holding `\ud800` and the same text holding `\udc00` were one body (an adversarial
 * helper: a different body under the same key was replayed the first one's answer, 20 of 20).
 */
function isWellFormed(text: string): boolean {
  return (text as string & { isWellFormed(): boolean }).isWellFormed();
}

/** The bytes begin (after JSON whitespace and a UTF-8 byte-order mark) an object or an array. */
function isJsonText(bytes: Uint8Array): boolean {
  let i = bytes[0] === 0xef && bytes[1] === 0xbb && bytes[2] === 0xbf ? 3 : 0;
  while (bytes[i] === 0x20 || bytes[i] === 0x09 || bytes[i] === 0x0a || bytes[i] === 0x0d) i++;
  return bytes[i] === 0x7b || bytes[i] === 0x5b;
}

const MEDIA_TYPE = /^[\w!#$&^.+-]{1,64}\/[\w!#$&^.+-]{1,64}$/;

/** The media type of a Content-Type, lower case, or '' when it is not a plain `type/subtype`. */
function mediaTypeOf(contentType: string | undefined): string {
  const type = contentType?.split(';', 1)[0]!.trim().toLowerCase() ?? '';
  return MEDIA_TYPE.test(type) ? type : '';
}

const rawParsers = (type: string) => `Express app.useBodyParser('raw', { type: ['${type}'] }), Fastify app.useBodyParser(['${type}'])`;

/** Why a body no parser read cannot be fingerprinted, and which parser the server lacks. */
function unreadBody(contentType: string | undefined): IdempotencyError {
  const type = mediaTypeOf(contentType);
  if (!type) {
    return new IdempotencyError('no body parser read its body; send it with a Content-Type this endpoint accepts.');
  }
  if (type === 'multipart/form-data') {
    // A raw parser would take the parts from whatever reads them after the guard (the handler).
    return new IdempotencyError(
      'no body parser read its multipart/form-data body before the guard (a handler that reads the parts itself runs ' +
        'after it); the server can read the upload with FileInterceptor or its kin (@nestjs/platform-express, ' +
        "@nestjs/platform-fastify/multipart), or @fastify/multipart's attachFieldsToBody.",
    );
  }
  return new IdempotencyError(
    `no body parser read its ${type} body; send a Content-Type this endpoint accepts ` +
      `(the server can register a parser for ${type}: ${rawParsers(type)}).`,
  );
}

/** The fingerprint a call whose body's bytes are lost claims under a client's key: matching no other call. */
export const unmatchableFingerprint = (token: string) => `${UNMATCHABLE}${token}`;
const UNMATCHABLE = 'unmatchable:';

/** Whether `fingerprint` is a call's whose body's bytes are lost (`unmatchableFingerprint`). */
export const isUnmatchable = (fingerprint: string) => fingerprint.startsWith(UNMATCHABLE);

/**
 * Why a call whose body's bytes are lost is refused where its key was claimed already: it may be
 * the retry of the call that ran, or another call, and nothing tells which. Answered "key reused:
 * send a new key for a new operation", a client that followed it ran the operation again (an
 * adversarial helper: a retry of text holding U+FFFD, after the first answer was cut).
 */
export const UNMATCHABLE_RETRY =
  'its text is not valid in its charset (its parser replaced bytes with U+FFFD), so it cannot be matched to the call that ' +
  'first used this key, which may have run: read the resource\'s current state before sending it again, under this key or another ' +
  '(text sent as UTF-8 or naming its charset, charset=iso-8859-1, is another payload under this key)';

/**
 * A body whose bytes are lost: text its parser could not decode (U+FFFD stands for any bytes),
 * without `rawBody`. No other call is known to be the same: a guard may claim such a call under a
 * client's key with a fingerprint no other call has, but must not key it by its fingerprint.
 */
export class UnmatchableBodyError extends IdempotencyError {}

/** Why text its parser could not decode cannot be fingerprinted without its bytes, and what to do. */
function undecodableText(contentType: string): UnmatchableBodyError {
  const type = mediaTypeOf(contentType);
  return new UnmatchableBodyError(
    'its text is not valid in its charset (its parser replaced bytes with U+FFFD, so different bodies would look alike); ' +
      'send it as UTF-8 or name its charset (charset=iso-8859-1)' +
      (type ? ` (the server can register a raw parser for ${type}: ${rawParsers(type)}, or keep rawBody: true).` : '.'),
  );
}

/**
 * `{"hosts":…,"params":…,"query":…,"queryAsSent":…}` as canonical JSON writes that object
 * (names in order, an absent part left out), with `ignoreFields` applied inside the query only.
 */
function writeRoute(w: CanonicalWriter, { hosts, params, query, queryAsSent }: FingerprintInput): void {
  let first = true;
  const part = (name: string, value: unknown, keepAll: boolean) => {
    if (value === undefined || typeof value === 'function' || typeof value === 'symbol') return;
    w.text(first ? '{' : ',');
    first = false;
    w.string(name);
    w.text(':');
    if (keepAll) w.valueKeepingAll(value);
    else w.value(value);
  };
  part('hosts', hosts, true);
  part('params', params, true);
  part('query', query, false);
  part('queryAsSent', queryAsSent, true);
  w.text(first ? '{}' : '}');
}

/**
 * SHA-256 (hex) of a request's method, route path, query and body: two requests get the same
 * fingerprint exactly when they mean the same operation.
 *
 * - The method is upper-cased; the path is taken as given.
 * - Query and JSON bodies go through {@link canonicalJson}: keys sorted at every depth,
 *   `ignoreFields` removed at any depth (in both), arrays in order. Path and host parameters
 *   (`params`, `hosts`) are hashed with the query and never lose a field. A property set to
 *   `undefined` hashes like an absent one; `null` is a value and differs from absent.
 * - A body that is not JSON (a `Content-Type` other than `application/json` or `+json`: XML,
 *   text, form, octet-stream) is hashed as its raw bytes when `rawBody` is given. Without it, a
 *   Buffer body (a raw parser) is hashed as its bytes and a string body (a text parser) as its
 *   UTF-8 bytes: for UTF-8 text (no byte-order mark), the very bytes `rawBody` would hold, so
 *   both give one fingerprint; whitespace matters either way. Text a parser decoded from another
 *   charset is hashed as its UTF-8 encoding, or as its UTF-16LE code units (kind `"utf16"`)
 *   where it holds a lone surrogate, which UTF-8 cannot encode; text it could not decode (U+FFFD in it) throws
 *   {@link UnmatchableBodyError} without `rawBody`. Other parsed bodies are hashed as JSON, with `rawBody`
 *   or without, except a form (raw bytes that are not a JSON object or array), which `rawBody`
 *   hashes as its bytes. A body absent altogether (`undefined`, no `rawBody`) differs from a JSON
 *   `null` body; one that arrived but that no parser read (`hasBody`) throws `IdempotencyError`.
 * - Uploaded `files` count by field, name, type, size and SHA-256, in order.
 *
 * Hashed bytes (UTF-8): the JSON array `["fp1",METHOD,path,query,kind]` (for raw bodies
 * `[...,"raw",byteLength]`, `[...,"utf16",byteLength]`; with files, `"files",[[field,name,type,size,sha256],...]` before the
 * kind), then the body: canonical JSON text for kind `"json"`, the raw bytes for `"raw"`, the
 * UTF-16LE code units for `"utf16"`, nothing
 * for `"none"`. Every string in the array is JSON-quoted and the array ends at its own `]`, so no
 * method, path, query, file or body can move a boundary and collide with another request.
 */
export function fingerprintRequest(input: FingerprintInput, ignoreFields?: ReadonlySet<string>): string {
  const bytes = bytesOf(input);
  if (bytes === undefined && input.body === undefined && input.hasBody) throw unreadBody(input.contentType);
  const text16 = typeof bytes === 'string' && !isWellFormed(bytes) ? Buffer.from(bytes, 'utf16le') : undefined;
  const sha256 = new Sha256Sink();
  writeCanonical(sha256, ignoreFields, (w) => {
    w.text('["fp1",');
    w.string(input.method.toUpperCase());
    w.text(',');
    w.string(input.path);
    w.text(',');
    if (input.params !== undefined || input.hosts !== undefined) writeRoute(w, input);
    else if (!w.value(input.query)) w.text('null');
    if (input.files?.length) {
      w.text(',"files",');
      w.value(input.files.map((f) => [f.field, f.name, f.type, f.size, f.sha256]));
    }
    if (text16 !== undefined) {
      w.text(',"utf16",' + text16.byteLength + ']');
    } else if (bytes !== undefined) {
      w.text(',"raw",' + (typeof bytes === 'string' ? Buffer.byteLength(bytes, 'utf8') : bytes.byteLength) + ']');
    } else if (input.body === undefined) {
      w.text(',"none"]');
    } else {
      w.text(',"json"]');
      if (!w.value(input.body)) w.text('null');
    }
  });
  // A string hashes as its UTF-8 bytes (`Hash.update` and `crypto.hash` encode it so), uncopied.
  if (text16 !== undefined) sha256.update(text16);
  else if (bytes !== undefined) sha256.update(bytes);
  return sha256.hex();
}
