import { IdempotencyError } from '../errors/idempotency.errors.js';

/** Deepest nesting of arrays and objects serialised; deeper input throws `IdempotencyError`. */
export const MAX_CANONICAL_DEPTH = 1000;

/** Where serialised bytes go: a `node:crypto` Hash, or a collector. */
export interface CanonicalSink {
  update(data: Uint8Array | string): unknown;
}

// What JSON.stringify escapes, plus every surrogate (lone ones are escaped; pairs merely take the slow path).
const NEEDS_ESCAPE = /[\u0000-\u001f"\\\ud800-\udfff]/;
const CHUNK = 64 * 1024;
const LIMIT = CHUNK - 8;
// Strings up to this length are encoded in JS; a native call costs more than a short loop.
const SHORT = 32;

/**
 * Writes canonical JSON (see `canonicalJson` in fingerprint.ts) as UTF-8 straight into a reusable
 * 64 KiB buffer flushed into a sink (the hash). Faster than building one string and hashing it:
 * no rope to flatten, no second copy to encode, and memory bounded whatever the body size.
 * Not re-entrant: use one instance per serialisation in progress.
 */
export class CanonicalWriter {
  private readonly buf = Buffer.allocUnsafe(CHUNK);
  private pos = 0;
  private depth = 0;
  private sink: CanonicalSink | undefined;
  private ignored: ReadonlySet<string> | undefined;

  /** Binds the writer to a sink (and the keys to drop) for one serialisation. */
  begin(sink: CanonicalSink, ignored: ReadonlySet<string> | undefined): void {
    this.sink = sink;
    this.ignored = ignored !== undefined && ignored.size > 0 ? ignored : undefined;
    this.pos = 0;
    this.depth = 0;
  }

  /** Flushes what is buffered and unbinds the sink. */
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
    if (n <= SHORT) {
      const buf = this.buf;
      let pos = this.pos;
      let i = 0;
      for (; i < n; i++) {
        const c = s.charCodeAt(i);
        if (c >= 0x80) break;
        buf[pos++] = c;
      }
      if (i === n) return void (this.pos = pos);
    }
    this.pos += this.buf.write(s, this.pos, 'utf8');
  }

  /** Writes a JSON string literal, escaped as JSON.stringify escapes it. */
  string(s: string): void {
    const n = s.length;
    if (n <= SHORT) {
      if (this.pos + n * 3 + 2 > LIMIT) this.flush();
      if (this.shortString(s, n)) return;
    } else if (n < 5000 && !NEEDS_ESCAPE.test(s)) {
      this.byte(0x22);
      this.text(s);
      this.byte(0x22);
      return;
    }
    this.text(JSON.stringify(s));
  }

  /** Quotes and encodes in one pass; false (nothing kept) when `s` needs escaping. */
  private shortString(s: string, n: number): boolean {
    const buf = this.buf;
    let pos = this.pos;
    buf[pos++] = 0x22;
    for (let i = 0; i < n; i++) {
      let c = s.charCodeAt(i);
      if (c < 0x80) {
        if (c < 0x20 || c === 0x22 || c === 0x5c) return false;
        buf[pos++] = c;
      } else if (c < 0x800) {
        buf[pos++] = 0xc0 | (c >> 6);
        buf[pos++] = 0x80 | (c & 0x3f);
      } else if (c < 0xd800 || c > 0xdfff) {
        buf[pos++] = 0xe0 | (c >> 12);
        buf[pos++] = 0x80 | ((c >> 6) & 0x3f);
        buf[pos++] = 0x80 | (c & 0x3f);
      } else {
        const low = s.charCodeAt(i + 1); // NaN past the end
        // A lone surrogate: JSON.stringify escapes it as \uXXXX.
        if (c > 0xdbff || !(low >= 0xdc00 && low <= 0xdfff)) return false;
        c = ((c - 0xd800) << 10) + (low - 0xdc00) + 0x10000;
        i++;
        buf[pos++] = 0xf0 | (c >> 18);
        buf[pos++] = 0x80 | ((c >> 12) & 0x3f);
        buf[pos++] = 0x80 | ((c >> 6) & 0x3f);
        buf[pos++] = 0x80 | (c & 0x3f);
      }
    }
    buf[pos++] = 0x22;
    this.pos = pos;
    return true;
  }

  /** Writes a value as canonical JSON; false (nothing written) where JSON omits it. */
  value(value: unknown): boolean {
    switch (typeof value) {
      case 'string':
        this.string(value);
        return true;
      case 'number':
        // JSON has no text for a non-finite number: a bare token no JSON text holds, not `null`.
        this.text(Number.isFinite(value) ? '' + value : String(value));
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

  /** Writes a value as `value` does, with nothing removed (`ignoreFields` does not apply to it). */
  valueKeepingAll(value: unknown): boolean {
    const ignored = this.ignored;
    this.ignored = undefined;
    try {
      return this.value(value);
    } finally {
      this.ignored = ignored;
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
    if (++this.depth > MAX_CANONICAL_DEPTH) {
      throw new IdempotencyError(`it nests deeper than ${MAX_CANONICAL_DEPTH} levels; send a flatter payload.`);
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
