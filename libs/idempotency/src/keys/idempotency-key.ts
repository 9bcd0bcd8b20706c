import { IDEMPOTENCY_KEY_HEADER, MAX_KEY_LENGTH } from '../idempotency.constants.js';
import { sentMoreThanOnce, type RequestHeaders } from './header-lines.js';

/**
 * What a client's `Idempotency-Key` header holds: a usable `key`, or the reason it is `invalid`
 * (answer 400 with that reason). A missing header is `undefined`, not one of these.
 */
export type ParsedKeyHeader = { readonly key: string } | { readonly invalid: string };

const CONTROL = /[\u0000-\u001F\u007F-\u009F]/;
const NOT_TEXT = /[\p{Cs}\uFFFD]/u;
/**
 * A character drawn as something: neither white space (JavaScript's `\s`) nor one Unicode says to
 * draw as nothing (Default_Ignorable_Code_Point: the zero-width space U+200B, the word joiner
 * U+2060, the soft hyphen U+00AD, the Hangul fillers, variation selectors...).
 */
const VISIBLE = /[^\s\p{Default_Ignorable_Code_Point}]/u;

/**
 * An integer past 2^53 (`Number.MAX_SAFE_INTEGER`): a double does not hold it exactly, and a JSON
 * parse rounds it to the nearest one it holds, so ids sent as such numbers (a snowflake id from
 * Java or Go) fall together: 1234567890123456037 is read as 1234567890123456000, as are the ids
 * up to 128 on either side. As an id it names another's record.
 */
export function isUnsafeInteger(value: unknown): value is number {
  return typeof value === 'number' && Number.isInteger(value) && !Number.isSafeInteger(value);
}

/** Text of white space and invisible characters only (see `VISIBLE`), or empty: what reads as nothing. */
export function isBlankText(text: string): boolean {
  return !VISIBLE.test(text);
}

/**
 * Reads the `Idempotency-Key` request header.
 *
 * Accepts the IETF draft's structured-field string form `"abc"` (quotes stripped, `\"` and `\\`
 * unescaped) and the bare form `abc`; both mean the key `abc`. Surrounding spaces and tabs are
 * trimmed (inside quotes they are kept). The key is then checked with {@link validateKey}.
 *
 * A repeated header is invalid, never "missing": an array value (as some platforms give) is
 * refused, and Node's joined form of two quoted values (`"a", "b"`) is a malformed quoted string.
 * Node joins two bare values into one (`a, b`), which cannot be told apart here from a key
 * holding a comma: the guard asks the request's `headersDistinct` (`client-key.ts`).
 *
 * @returns `undefined` when the header is absent; `{ key }` when usable; `{ invalid: reason }`
 *   otherwise, including an empty header.
 */
export function parseKeyHeader(value: string | string[] | undefined): ParsedKeyHeader | undefined {
  if (value === undefined) return undefined;
  if (Array.isArray(value)) {
    if (value.length === 0) return undefined;
    if (value.length > 1) return { invalid: 'the header was sent more than once' };
    value = value[0];
  }
  const text = trimOws(value);
  let key = text;
  if (text.startsWith('"')) {
    const unquoted = unquote(text);
    if (unquoted === undefined) {
      return { invalid: 'it is a malformed quoted string, or the header was sent more than once' };
    }
    key = unquoted;
  }
  const reason = validateKey(key);
  return reason === undefined ? { key } : { invalid: reason };
}

/**
 * Reads a request's key header as the guard does: its value in `request.headers` (what a
 * middleware set or rewrote there included), through `parseKeyHeader`, refused when the client
 * sent it on more than one line: Node joins two lines into one value (`K, K`), a key of its own
 * (an adversarial helper: the demo's payments read `@Headers()`, and an operation's retry with
 * `K` paid again). For code that keys by the header itself (the transactional mode).
 *
 * @param request an Express, Fastify, Node.js or HTTP/2 request
 * @param name the header, any case (default `Idempotency-Key`)
 */
export function readKeyHeader(request: RequestHeaders, name: string = IDEMPOTENCY_KEY_HEADER): ParsedKeyHeader | undefined {
  const lower = name.toLowerCase();
  const parsed = parseKeyHeader(request.headers[lower]);
  // Two lines read as one value `a, b`: a comma asks whether it came on two lines.
  if (parsed && 'key' in parsed && parsed.key.includes(',') && sentMoreThanOnce(request, lower)) {
    return { invalid: 'the header was sent more than once' };
  }
  return parsed;
}

/**
 * Checks a client key.
 *
 * @returns `undefined` when the key is usable; otherwise why not: empty, only white space (as
 *   JavaScript's `\s` counts it: a header's spaces are trimmed to empty, a body field's would key
 *   every blank value alike) or invisible characters (`VISIBLE`: a zero-width space looks blank
 *   too), longer than
 *   `MAX_KEY_LENGTH` (255) characters counted as Unicode code points, holding a control
 *   character (C0, DEL or C1), or not valid text (a lone surrogate, or U+FFFD, which is what
 *   undecodable bytes become).
 */
export function validateKey(key: string): string | undefined {
  if (key.length === 0) return 'it is empty';
  // Printable ASCII without spaces (UUIDs, ULIDs, most keys) passes the three tests below: one
  // loop in place of three regular expressions on every request.
  if (!isPrintableAscii(key)) {
    if (!VISIBLE.test(key)) return 'it is only white space or invisible characters';
    if (CONTROL.test(key)) return 'it contains a control character';
    if (NOT_TEXT.test(key)) return 'it is not valid UTF-8 text';
  }
  // UTF-16 length >= code points, so only long strings need counting.
  if (key.length > MAX_KEY_LENGTH && codePoints(key) > MAX_KEY_LENGTH) {
    return `it is longer than ${MAX_KEY_LENGTH} characters`;
  }
  return undefined;
}

/** Every character is printable ASCII other than the space (`!` to `~`). */
function isPrintableAscii(s: string): boolean {
  for (let i = 0; i < s.length; i++) {
    const c = s.charCodeAt(i);
    if (c < 0x21 || c > 0x7e) return false;
  }
  return true;
}

function codePoints(s: string): number {
  let n = 0;
  for (let i = 0; i < s.length; i++) {
    const c = s.charCodeAt(i);
    // Only called on well-formed text: a high surrogate always starts a pair.
    if (c < 0xd800 || c > 0xdbff) n++;
  }
  return n;
}

/** Trims HTTP optional whitespace (SP, HTAB) without a backtracking regex. */
function trimOws(s: string): string {
  let start = 0;
  let end = s.length;
  while (start < end && (s[start] === ' ' || s[start] === '\t')) start++;
  while (end > start && (s[end - 1] === ' ' || s[end - 1] === '\t')) end--;
  return s.slice(start, end);
}

/** RFC 8941 sf-string body: `\"` and `\\` are the only escapes; the closing quote ends the text. */
function unquote(s: string): string | undefined {
  let out = '';
  let i = 1;
  while (i < s.length) {
    const c = s[i++];
    if (c === '"') return i === s.length ? out : undefined;
    if (c === '\\') {
      const next = s[i++];
      if (next !== '"' && next !== '\\') return undefined;
      out += next;
    } else {
      out += c;
    }
  }
  return undefined;
}
