import { IdempotencyConfigError, IdempotencyKeyError } from '../errors/idempotency.errors.js';
import { isUnsafeInteger } from './idempotency-key.js';

/** Where a key expression starts reading. `#req` is accepted as the legacy alias of `#body`. */
export type KeyRoot = 'body' | 'headers' | 'query' | 'params' | 'user' | 'data';

/**
 * A parsed key expression: a root and the property names walked from it.
 * Built once at application start by {@link parseKeyExpression}; evaluated per request.
 */
export interface KeyPath {
  readonly root: KeyRoot;
  /** Property names in walking order; array indexes are kept as their decimal text. */
  readonly segments: readonly string[];
  /** The expression as written, for messages. */
  readonly expression: string;
}

/** Each root as a client knows it: where it puts the key. */
const ROOT_WORDS: Record<KeyRoot, (field: string) => string> = {
  body: (field) => (field ? `the body field "${field}"` : 'the request body'),
  headers: (field) => `the ${field} header`,
  query: (field) => (field ? `the query parameter "${field}"` : 'the query string'),
  params: (field) => (field ? `the path parameter "${field}"` : 'the path parameters'),
  user: (field) => (field ? `the user's "${field}"` : 'the user'),
  data: (field) => (field ? `the message field "${field}"` : 'the message'),
};

/** Where a key expression reads, in the client's words (`the body field "orderNo"`), for messages. */
export function describeKeyPath(path: KeyPath): string {
  return ROOT_WORDS[path.root](path.segments.join('.'));
}

/** What a key expression can read from. Absent sources evaluate to `undefined`. */
export interface KeySources {
  body?: unknown;
  /** Request headers with lower-case names, as Node gives them. */
  headers?: Record<string, string | string[] | undefined>;
  query?: unknown;
  params?: unknown;
  user?: unknown;
  /** The payload of an RPC message (microservice handlers). */
  data?: unknown;
}

const ROOTS: ReadonlyMap<string, KeyRoot> = new Map<string, KeyRoot>([
  ['body', 'body'],
  ['req', 'body'],
  ['headers', 'headers'],
  ['query', 'query'],
  ['params', 'params'],
  ['user', 'user'],
  ['data', 'data'],
]);
const ROOT_LIST = 'body, headers, query, params, user, data (or req, an alias of body)';

/** Names never walked into, whatever object holds them (prototype pollution guard). */
const FORBIDDEN: ReadonlySet<string> = new Set(['__proto__', 'constructor', 'prototype']);

const IDENT = /[A-Za-z_$][A-Za-z0-9_$]*/y;
const INDEX = /(?:0|[1-9][0-9]*)(?=\])/y;

/**
 * Parses a key expression such as `#body.orderNo`, `#headers['x-request-id']`, `#query.ref`,
 * `#params.id`, `#user.tenant.id`, `#data.items[0].sku` or the legacy `#req.orderNo`.
 *
 * Grammar: `#` root, then any number of `.identifier`, `['single quoted']`, `["double quoted"]`
 * or `[non-negative integer]` segments. Inside quotes only `\\`, `\'` and `\"` are escapes.
 * Header names are lower-cased (Node lower-cases incoming header names).
 * Nothing is evaluated as code.
 *
 * @param expr the expression from the decorator
 * @param where the route it belongs to, for the message (e.g. `OrdersController.create`)
 * @throws IdempotencyConfigError naming `where`, the expression and what is wrong
 */
export function parseKeyExpression(expr: string, where: string): KeyPath {
  const fail = (what: string): never => {
    throw new IdempotencyConfigError(
      `${where}: invalid idempotency key expression ${JSON.stringify(expr)}: ${what}`,
    );
  };
  if (typeof expr !== 'string' || expr.length === 0) {
    return fail(`it is empty; write e.g. "#body.orderNo" with a root among ${ROOT_LIST}`);
  }
  if (expr[0] !== '#') return fail(`it must start with "#" followed by one of ${ROOT_LIST}`);

  let pos = 1;
  const readIdent = (): string | undefined => {
    IDENT.lastIndex = pos;
    const m = IDENT.exec(expr);
    if (m === null) return undefined;
    pos = IDENT.lastIndex;
    return m[0];
  };

  const rootName = readIdent();
  if (rootName === undefined) return fail(`expected a root after "#": one of ${ROOT_LIST}`);
  const root = ROOTS.get(rootName) ?? fail(`unknown root "#${rootName}"; use one of ${ROOT_LIST}`);

  const segments: string[] = [];
  while (pos < expr.length) {
    const c = expr[pos];
    if (c === '.') {
      pos++;
      const name = readIdent();
      if (name === undefined) {
        return fail(`expected a property name at position ${pos}; write ['...'] for names that are not identifiers`);
      }
      segments.push(name);
    } else if (c === '[') {
      pos++;
      const quote = expr[pos];
      if (quote === "'" || quote === '"') {
        segments.push(readQuoted(quote));
      } else {
        INDEX.lastIndex = pos;
        const m = INDEX.exec(expr);
        if (m === null) return fail(`expected a quoted name or a non-negative integer after "[" at position ${pos - 1}`);
        segments.push(m[0]);
        pos = INDEX.lastIndex;
      }
      if (expr[pos] !== ']') return fail(`expected "]" at position ${pos}`);
      pos++;
    } else {
      return fail(`unexpected ${JSON.stringify(c)} at position ${pos}; write ['...'] for names that are not identifiers`);
    }
  }

  for (const s of segments) {
    if (FORBIDDEN.has(s)) return fail(`"${s}" may not be used as a property name`);
  }
  if (root === 'headers' && segments.length > 0) segments[0] = segments[0].toLowerCase();
  return Object.freeze({ root, segments: Object.freeze(segments), expression: expr });

  function readQuoted(quote: string): string {
    const start = pos;
    let out = '';
    pos++;
    for (;;) {
      if (pos >= expr.length) return fail(`unterminated string starting at position ${start}`);
      const ch = expr[pos++];
      if (ch === quote) return out;
      if (ch === '\\') {
        const next = expr[pos++];
        if (next !== '\\' && next !== "'" && next !== '"') {
          return fail(`unsupported escape at position ${pos - 2}; only \\\\, \\' and \\" are allowed`);
        }
        out += next;
      } else {
        out += ch;
      }
    }
  }
}

/**
 * Reads the key a parsed expression points at. Walks own properties only and never
 * `__proto__`, `constructor` or `prototype`.
 *
 * @returns a string as is; a finite number, bigint or boolean as `String(value)`; `undefined`
 *   for null, undefined, a missing property, or a path through null or undefined (no key was sent)
 * @throws IdempotencyKeyError for a value that is there but is no one key: an object, an array (a
 *   form field, query parameter or header sent twice), NaN or Infinity; and for a path through a
 *   primitive or through a list by a name. Taking it for no key ran every such call unguarded on
 *   a route that does not require a key.
 */
export function evaluateKeyPath(path: KeyPath, sources: KeySources): string | undefined {
  if (!Object.hasOwn(sources, path.root)) return undefined;
  let current: unknown = (sources as Record<string, unknown>)[path.root];
  for (const segment of path.segments) {
    if (current === null || current === undefined) return undefined;
    // Sent, but not where a key can be: `{"order":"A1"}` for `#body.order.no`, a list for a
    // name, a text body (Fastify's text/plain) for `#body.orderNo`. Taken for no key, a route
    // with `required: false` ran every such call unguarded (an adversarial helper).
    if (typeof current !== 'object' || (Array.isArray(current) && !/^\d+$/.test(segment))) {
      throw new IdempotencyKeyError(`${describeKeyPath(path)} cannot be read: what holds it is ${kindOf(current)}`);
    }
    if (FORBIDDEN.has(segment) || !Object.hasOwn(current, segment)) return undefined;
    current = (current as Record<string, unknown>)[segment];
  }
  return keyText(current, () => describeKeyPath(path));
}

/**
 * A value a key expression or a key function found, as key text: a string as it is, a finite
 * number (an integer within ±2^53: past that a JSON parse rounded it, and keys apart fell
 * together, an adversarial helper), a bigint or a boolean as its text; null or undefined is no key.
 *
 * @param where names the value in the client's words, for the refusal's message
 * @throws IdempotencyKeyError for anything else (an object, an array, NaN): it is never its
 *   `String()` (every object would be the one key `[object Object]`), and never no key
 */
export function keyText(value: unknown, where: () => string): string | undefined {
  switch (typeof value) {
    case 'string':
      return value;
    case 'number':
      if (Number.isFinite(value) && !isUnsafeInteger(value)) return String(value);
      break;
    case 'bigint':
    case 'boolean':
      return String(value);
    case 'undefined':
      return undefined;
    case 'object':
      if (value === null) return undefined;
      break;
  }
  throw new IdempotencyKeyError(`${where()} is ${kindOf(value)}, not one value`);
}

function kindOf(value: unknown): string {
  if (Array.isArray(value)) return 'a list (was it sent more than once?)';
  if (isUnsafeInteger(value)) return `${String(value)}, an integer past 2^53 that a double does not hold exactly (send it as a string)`;
  if (typeof value === 'number') return String(value);
  return typeof value === 'object' ? 'an object' : typeof value === 'string' ? 'a text' : `a ${typeof value}`;
}
