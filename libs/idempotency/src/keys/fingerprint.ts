import { createHash } from 'node:crypto';
import { IdempotencyError } from '../errors/idempotency.errors.js';

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

/** Deepest nesting of arrays and objects fingerprinted; deeper input throws `IdempotencyError`. */
export const MAX_FINGERPRINT_DEPTH = 1000;

interface Sink {
  update(data: Uint8Array | string): unknown;
}

// What JSON.stringify escapes, plus every surrogate (it escapes lone ones; pairs take the slow path).
const NEEDS_ESCAPE = /[\u0000-\u001f"\\\ud800-\udfff]/;
const CHUNK = 64 * 1024;
const LIMIT = CHUNK - 8;
// Longer text is encoded by Node itself: a native call costs more than a short JS loop.
const NATIVE_FROM = Number(process.env.NF ?? 48);

/**
 * Writes canonical JSON as UTF-8 straight into a reusable buffer that is flushed into a sink
 * (the hash). Faster than building one big string: no rope to flatten, no copy to encode.
 */
class CanonicalWriter {
  private readonly buf = Buffer.allocUnsafe(CHUNK);
  private pos = 0;
  private depth = 0;
  private sink: Sink | undefined;
  private ignored: ReadonlySet<string> | undefined;

  begin(sink: Sink, ignored: ReadonlySet<string> | undefined): void {
    this.sink = sink;
    this.ignored = ignored !== undefined && ignored.size > 0 ? ignored : undefined;
    this.pos = 0;
    this.depth = 0;
  }

  end(): void {
    if (this.pos > 0) this.flush();
    this.sink = undefined;
    this.ignored = undefined;
  }

  /** Writes text that is well-formed UTF-16 (no lone surrogates), UTF-8 encoded. */
  text(s: string): void {
    const n = s.length;
    if (this.pos + n * 3 > LIMIT) {
      this.flush();
      if (n * 3 > LIMIT) return void this.sink!.update(s);
    }
    const buf = this.buf;
    if (n > NATIVE_FROM) {
      this.pos += buf.write(s, this.pos, 'utf8');
      return;
    }
    let pos = this.pos;
    for (let i = 0; i < n; i++) {
      let c = s.charCodeAt(i);
      if (c < 0x80) {
        buf[pos++] = c;
      } else if (c < 0x800) {
        buf[pos++] = 0xc0 | (c >> 6);
        buf[pos++] = 0x80 | (c & 0x3f);
      } else if (c < 0xd800 || c > 0xdfff) {
        buf[pos++] = 0xe0 | (c >> 12);
        buf[pos++] = 0x80 | ((c >> 6) & 0x3f);
        buf[pos++] = 0x80 | (c & 0x3f);
      } else {
        c = ((c - 0xd800) << 10) + (s.charCodeAt(++i) - 0xdc00) + 0x10000;
        buf[pos++] = 0xf0 | (c >> 18);
        buf[pos++] = 0x80 | ((c >> 12) & 0x3f);
        buf[pos++] = 0x80 | ((c >> 6) & 0x3f);
        buf[pos++] = 0x80 | (c & 0x3f);
      }
    }
    this.pos = pos;
  }

  /** Writes a JSON string literal. */
  string(s: string): void {
    if (s.length < 5000 && !NEEDS_ESCAPE.test(s)) {
      this.byte(0x22);
      this.text(s);
      this.byte(0x22);
    } else {
      this.text(JSON.stringify(s));
    }
  }

  /** Writes a value as canonical JSON; false (nothing written) where JSON omits it. */
  value(value: unknown): boolean {
    switch (typeof value) {
      case 'string':
        this.string(value);
        return true;
      case 'number':
        this.text(Number.isFinite(value) ? '' + value : 'null');
        return true;
      case 'boolean':
        this.text(value ? 'true' : 'false');
        return true;
      case 'bigint':
        this.text(value.toString());
        return true;
      case 'object':
        if (value === null) this.text('null');
        else if (Array.isArray(value)) this.array(value);
        else if (typeof (value as { toJSON?: unknown }).toJSON === 'function') {
          return this.value((value as { toJSON(): unknown }).toJSON());
        } else this.object(value as Record<string, unknown>);
        return true;
      default:
        return false;
    }
  }

  private array(array: readonly unknown[]): void {
    this.enter();
    this.byte(0x5b);
    for (let i = 0; i < array.length; i++) {
      if (i > 0) this.byte(0x2c);
      if (!this.value(array[i])) this.text('null');
    }
    this.byte(0x5d);
    this.depth--;
  }

  private object(object: Record<string, unknown>): void {
    this.enter();
    const keys = sortKeys(Object.keys(object));
    const ignored = this.ignored;
    this.byte(0x7b);
    let first = true;
    for (let i = 0; i < keys.length; i++) {
      const key = keys[i];
      if (ignored !== undefined && ignored.has(key)) continue;
      const value = object[key];
      const type = typeof value;
      if (type === 'undefined' || type === 'function' || type === 'symbol') continue;
      if (!first) this.byte(0x2c);
      first = false;
      this.string(key);
      this.byte(0x3a);
      this.value(value);
    }
    this.byte(0x7d);
    this.depth--;
  }

  private enter(): void {
    if (++this.depth > MAX_FINGERPRINT_DEPTH) {
      throw new IdempotencyError(`The request nests deeper than ${MAX_FINGERPRINT_DEPTH} levels; it cannot be fingerprinted.`);
    }
  }

  private byte(b: number): void {
    if (this.pos >= LIMIT) this.flush();
    this.buf[this.pos++] = b;
  }

  private flush(): void {
    this.sink!.update(this.buf.subarray(0, this.pos));
    this.pos = 0;
  }
}

/** Code-unit order, as `Array.prototype.sort()` gives; insertion sort is faster on few keys. */
function sortKeys(keys: string[]): string[] {
  if (keys.length > 64) return keys.sort();
  for (let i = 1; i < keys.length; i++) {
    const key = keys[i];
    let j = i;
    while (j > 0 && keys[j - 1] > key) keys[j] = keys[--j];
    keys[j] = key;
  }
  return keys;
}

let idle: CanonicalWriter | undefined = new CanonicalWriter();

/** Runs `write` with a free writer (a `toJSON` may re-enter, so the shared one may be busy). */
function withWriter(sink: Sink, ignored: ReadonlySet<string> | undefined, write: (w: CanonicalWriter) => void): void {
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
 * Input must be acyclic (anything a body parser made is); nesting deeper than
 * {@link MAX_FINGERPRINT_DEPTH} throws `IdempotencyError`.
 *
 * @returns the text, or `undefined` for a top-level value JSON cannot represent (undefined).
 */
export function canonicalJson(value: unknown, ignoreFields?: ReadonlySet<string>): string | undefined {
  const chunks: Buffer[] = [];
  let written = false;
  const sink = {
    update: (data: Uint8Array | string) => chunks.push(typeof data === 'string' ? Buffer.from(data, 'utf8') : Buffer.from(data)),
  };
  withWriter(sink, ignoreFields, (w) => {
    written = w.value(value);
  });
  return written ? Buffer.concat(chunks).toString('utf8') : undefined;
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
 * - Query and JSON bodies go through {@link canonicalJson}: keys sorted, `ignoreFields` removed
 *   at any depth, a property set to `undefined` hashed like an absent one, `null` kept as a value.
 * - A body that is not JSON (a `Content-Type` other than `application/json` or `+json`: XML,
 *   text, form, octet-stream) is hashed as its raw bytes when `rawBody` is given, as is a Buffer
 *   body; whitespace then matters. Without `rawBody` the parsed body is used.
 *
 * Hashed bytes (UTF-8): the JSON array `["fp1",METHOD,path,query,kind]`, or `[...,"raw",n]`, then
 * the body: canonical JSON text for kind `"json"`, `n` raw bytes for `"raw"`, nothing for
 * `"none"`. Every string in the array is JSON-quoted and the array ends at its own `]`, so no
 * method, path, query or body can move a boundary and collide with another request.
 */
export function fingerprintRequest(input: FingerprintInput, ignoreFields?: ReadonlySet<string>): string {
  const hash = createHash('sha256');
  const raw = rawBytesOf(input);
  withWriter(hash, ignoreFields, (w) => {
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
  if (raw !== undefined) hash.update(raw);
  return hash.digest('hex');
}
