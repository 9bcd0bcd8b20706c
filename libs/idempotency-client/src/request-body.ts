/** What fetch takes as a request body. */
export type FetchBody = NonNullable<RequestInit['body']>;

/**
 * The body, encoded once, from what it holds when the call is made: strings and `Blob`s (which
 * cannot change) go as they are; bytes (`ArrayBuffer`, any view of one: typed arrays, `DataView`,
 * `Buffer`) as a copy, and `URLSearchParams` as its text (with fetch's Content-Type for it):
 * handed to fetch as they were, each attempt read them again, so a caller that changed them after
 * the call sent another payload under the same key (an adversarial helper: 422 after the first
 * attempt had taken effect, or the changed payload taking effect). A `FormData` is written to multipart bytes once, with the Content-Type
 * (and boundary) that goes with them, over one from the headers: handed to fetch as it is, each
 * attempt got a new boundary, so other bytes, and a retry was refused 422 as another payload by
 * a route that fingerprints the raw body (an adversarial helper). Other values become JSON,
 * unless JSON would not carry them as they are (see `jsonLoss`): then a TypeError, before
 * anything is sent.
 */
export async function encodeBody(body: unknown, headers: Headers): Promise<FetchBody | undefined> {
  if (body === undefined) return undefined;
  if (body instanceof FormData) {
    const multipart = new Response(body);
    headers.set('content-type', multipart.headers.get('content-type')!);
    return new Uint8Array(await multipart.arrayBuffer());
  }
  if (typeof body === 'string' || body instanceof Blob) return body;
  if (body instanceof ArrayBuffer) return new Uint8Array(body.slice(0));
  if (ArrayBuffer.isView(body)) {
    const copy = new Uint8Array(body.byteLength);
    copy.set(new Uint8Array(body.buffer, body.byteOffset, body.byteLength));
    return copy;
  }
  if (body instanceof URLSearchParams) {
    if (!headers.has('content-type')) headers.set('content-type', 'application/x-www-form-urlencoded;charset=UTF-8');
    return body.toString();
  }
  if (body instanceof ReadableStream) throw new TypeError('a stream body cannot be sent again on a retry: pass a string, bytes, a Blob or a value');
  const paths = new WeakMap<object, string>();
  const text = JSON.stringify(body, function (this: Record<string, unknown>, key: string, value: unknown) {
    const holder = paths.get(this);
    const at = holder === undefined ? 'body' : Array.isArray(this) ? `${holder}[${key}]` : `${holder}.${key}`;
    // `value` is what its toJSON made of it; the property's own value what the caller gave (read
    // from its descriptor: a getter or a proxy's trap runs once, as JSON.stringify runs it).
    const own = Object.getOwnPropertyDescriptor(this, key);
    const loss = (own && 'value' in own ? givenLoss(own.value) : undefined) ?? jsonLoss(value);
    if (loss) {
      throw new TypeError(`the body cannot go as JSON: ${at} is ${loss}. Send a string, bytes, a Blob or a FormData, or convert it to plain objects and arrays`);
    }
    if (typeof value === 'object' && value !== null) paths.set(value, at);
    return value;
  });
  if (!headers.has('content-type')) headers.set('content-type', 'application/json');
  return text;
}

/**
 * Why JSON would not carry a value as given, whatever its `toJSON` makes of it, or undefined:
 * bytes (a Buffer's toJSON writes `{"type":"Buffer","data":[...]}`), an invalid Date (its toJSON
 * gives null). Went so, in silence, before (an adversarial helper).
 */
/** Node's Buffer's toJSON (`{ type: 'Buffer', data }`), where there is a Buffer (not in a browser). */
const BUFFER_TO_JSON = (globalThis as { Buffer?: { prototype: { toJSON?: unknown } } }).Buffer?.prototype.toJSON;

function givenLoss(given: unknown): string | undefined {
  // Bytes with a toJSON of their own (a subclass that writes base64) go as that toJSON writes them.
  const toJSON = (given as { toJSON?: unknown } | null)?.toJSON;
  if ((given instanceof ArrayBuffer || ArrayBuffer.isView(given)) && (toJSON === undefined || toJSON === BUFFER_TO_JSON)) {
    const name = (given as { constructor?: { name?: string } }).constructor?.name ?? 'ArrayBuffer';
    return `${/^[AEIO]/.test(name) ? 'an' : 'a'} ${name} (bytes: JSON would write its numbers, not the bytes)`;
  }
  if (given instanceof Date && Number.isNaN(given.getTime())) return 'an invalid Date (JSON writes null)';
  return undefined;
}

/**
 * Why JSON would not carry a value (after its `toJSON`) as it is, or undefined. A plain object, an
 * array, a string, a finite number, a boolean and null go as they are; so does an instance of a
 * class that keeps its data in its fields (a DTO): JSON writes its own enumerable properties.
 * Refused: objects whose content is not in such properties (a Map, a Set, bytes, a Blob, a
 * FormData, an Error, a RegExp, a Promise, any other iterable), functions and symbols (dropped),
 * NaN and Infinity (written as null), BigInt (JSON.stringify throws). `undefined` is left out, as
 * JSON does.
 */
function jsonLoss(value: unknown): string | undefined {
  switch (typeof value) {
    case 'number':
      return Number.isFinite(value) ? undefined : `${value} (JSON writes null)`;
    case 'bigint':
      return 'a BigInt (JSON has no such number)';
    case 'function':
    case 'symbol':
      return `a ${typeof value} (JSON drops it)`;
    case 'object':
      break;
    default:
      return undefined;
  }
  if (value instanceof Number) return Number.isFinite(value.valueOf()) ? undefined : `${value.valueOf()} (JSON writes null)`;
  if (value === null || Array.isArray(value) || value instanceof String || value instanceof Boolean) return undefined;
  const name = (value as { constructor?: { name?: unknown } }).constructor?.name;
  const kind = typeof name !== 'string' || name === '' || name === 'Object' ? 'an object' : `${/^[AEIO]/.test(name) ? 'an' : 'a'} ${name}`;
  // A built-in (Map, Set, bytes, Blob, Error, ...) keeps its content in internal slots that JSON
  // does not see: its tag is not "Object". A class instance's or a plain object's is.
  if (Object.prototype.toString.call(value) !== '[object Object]') return `${kind} (JSON would not write it as it is)`;
  if (Symbol.iterator in value) return `${kind} that is iterable (JSON writes its fields, not its items)`;
  // An async iterable (an async generator, a stream-like object) went as `{}` (an adversarial helper).
  if (Symbol.asyncIterator in value) return `${kind} that is async iterable (JSON writes its fields, not its items; a stream cannot be sent twice)`;
  // A class that keeps its content behind getters (often over #private fields), with no field of
  // its own: JSON writes only own fields, so `{}` went, silently (an adversarial helper). A DTO
  // with fields and a convenience getter goes by its fields, as before.
  if (Object.keys(value).length === 0 && hasGetters(Object.getPrototypeOf(value))) return `${kind} whose content is in getters (JSON writes only its own fields: give it a toJSON)`;
  // Nor one whose fields are inherited (`Object.create({ a: 1 })`): JSON writes only its own, and
  // `{}` went, silently (an adversarial helper). A DTO whose optional fields are unset (no own
  // field, as with legacy class fields) goes as `{}`, as it means to.
  for (const name in value) if (!Object.hasOwn(value, name)) return `${kind} whose fields are inherited (JSON writes only its own fields: ${name})`;
  return undefined;
}

/** Whether a class prototype (up to `Object.prototype`) defines a getter. */
function hasGetters(prototype: object | null): boolean {
  for (let at = prototype; at !== null && at !== Object.prototype; at = Object.getPrototypeOf(at)) {
    for (const name of Object.getOwnPropertyNames(at)) if (Object.getOwnPropertyDescriptor(at, name)?.get) return true;
  }
  return false;
}
