import { createHash, hash, type Hash } from 'node:crypto';
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
 * In arrays such values become `null`, as in JSON. Non-finite numbers become `null`; a bigint
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
  /** Parsed query; absent hashes like `null`. */
  query?: unknown;
  /** Parsed body; a Buffer (or other Uint8Array) is hashed as its bytes. */
  body?: unknown;
  /** The body bytes as received; hashed instead of `body` when the body is not JSON. */
  rawBody?: Buffer;
  /** The request's `Content-Type` header. */
  contentType?: string;
}

/** True for `application/json` and any `+json` media type (parameters ignored). */
export function isJsonContentType(contentType: string): boolean {
  const end = contentType.indexOf(';');
  const type = (end === -1 ? contentType : contentType.slice(0, end)).trim().toLowerCase();
  return type === 'application/json' || type.endsWith('+json');
}

function rawBytesOf(input: FingerprintInput): Uint8Array | undefined {
  if (input.body instanceof Uint8Array) return input.body;
  if (input.rawBody === undefined) return undefined;
  if (input.body === undefined) return input.rawBody;
  const json = input.contentType === undefined || isJsonContentType(input.contentType);
  return json ? undefined : input.rawBody;
}

/**
 * SHA-256 (hex) of a request's method, route path, query and body: two requests get the same
 * fingerprint exactly when they mean the same operation.
 *
 * - The method is upper-cased; the path is taken as given.
 * - Query and JSON bodies go through {@link canonicalJson}: keys sorted at every depth,
 *   `ignoreFields` removed at any depth (in both), arrays in order. A property set to
 *   `undefined` hashes like an absent one; `null` is a value and differs from absent.
 * - A body that is not JSON (a `Content-Type` other than `application/json` or `+json`: XML,
 *   text, form, octet-stream) is hashed as its raw bytes when `rawBody` is given, and so is a
 *   Buffer body; whitespace then matters. Without `rawBody` the parsed body is used. A body
 *   absent altogether (`undefined`, no `rawBody`) differs from a JSON `null` body.
 *
 * Hashed bytes (UTF-8): the JSON array `["fp1",METHOD,path,query,kind]` (for raw bodies
 * `[...,"raw",byteLength]`), then the body: canonical JSON text for kind `"json"`, the raw bytes
 * for `"raw"`, nothing for `"none"`. Every string in the array is JSON-quoted and the array ends
 * at its own `]`, so no method, path, query or body can move a boundary and collide with
 * another request.
 */
export function fingerprintRequest(input: FingerprintInput, ignoreFields?: ReadonlySet<string>): string {
  const sha256 = new Sha256Sink();
  const raw = rawBytesOf(input);
  writeCanonical(sha256, ignoreFields, (w) => {
    w.text('["fp1",');
    w.string(input.method.toUpperCase());
    w.text(',');
    w.string(input.path);
    w.text(',');
    if (!w.value(input.query)) w.text('null');
    if (raw !== undefined) {
      w.text(',"raw",' + raw.byteLength + ']');
    } else if (input.body === undefined) {
      w.text(',"none"]');
    } else {
      w.text(',"json"]');
      if (!w.value(input.body)) w.text('null');
    }
  });
  if (raw !== undefined) sha256.update(raw);
  return sha256.hex();
}
