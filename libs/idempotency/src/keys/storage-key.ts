/**
 * The user segment of a storage key: whose record it is. A user id (empty for RPC messages,
 * which have no user), or the two or more parts of one (`getUser` giving `[tenantId, sub]`); for
 * anonymous callers keyed by address, their address; or every anonymous caller at once (keyed
 * only by keys the callers chose).
 */
export type KeyUser = { id: string } | { parts: readonly string[] } | { ip: string } | { anonymous: true };

/** The parts of a store key. */
export interface StorageKeyParts {
  /** The module's `keyPrefix`, used verbatim (it may hold ':' or a Redis `{hash tag}`). */
  prefix: string;
  user: KeyUser;
  /** `ControllerName.methodName`. */
  handler: string;
  /** The client's key, or the request fingerprint where the call carries none. */
  key: string | { fingerprint: string };
}

const LONE_SURROGATE = /\p{Cs}/u;
/** What `encodeURIComponent` leaves as it is, by character code: `A-Z a-z 0-9 - _ . ! ~ * ' ( )`. */
const UNRESERVED = new Uint8Array(128);
for (const c of "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_.!~*'()") UNRESERVED[c.charCodeAt(0)] = 1;

/** Whether `encodeURIComponent` leaves `value` as it is: a loop, not a regular expression, on every request's segments. */
function unreserved(value: string): boolean {
  for (let i = 0; i < value.length; i++) {
    const c = value.charCodeAt(i);
    if (c > 0x7f || UNRESERVED[c] === 0) return false;
  }
  return true;
}

/**
 * `encodeURIComponent`, which also takes lone surrogates (it throws URIError on them): those
 * become `%uXXXX`. Its own output never holds `%u` ('%' is always followed by two hex digits),
 * so the extension stays injective.
 */
function encodeSegment(value: string): string {
  if (unreserved(value)) return value;
  if (!LONE_SURROGATE.test(value)) return encodeURIComponent(value);
  let out = '';
  for (const char of value) {
    const c = char.charCodeAt(0);
    out += char.length === 1 && c >= 0xd800 && c <= 0xdfff ? `%u${c.toString(16).toUpperCase()}` : encodeURIComponent(char);
  }
  return out;
}

/**
 * The store key `<prefix>:<user>:<handler>:<key>`, where `<user>` is the encoded user id, the
 * encoded parts of one joined with ',', `ip:<encoded address>` for an anonymous client keyed by
 * address, or `anon:` for the shared namespace of anonymous clients, and `<key>` the encoded
 * client key, or `fp=<fingerprint>` for a call keyed by its fingerprint.
 *
 * No two different (user, handler, key) triples give the same string, whatever they hold
 * (':', '{', '}', '%', unicode, empty strings):
 * - each segment is percent-encoded (`encodeURIComponent` escapes ':', '{', '}' and '%'), so an
 *   encoded segment never contains ':' and decodes back to exactly one value;
 * - after the prefix, the key therefore splits on ':' into 3 parts for a user id and 4 for an
 *   address (`ip`, then the address, whose IPv6 colons are encoded too) or the anonymous
 *   namespace (`anon`, then an empty part). The part count tells a user id from the other two,
 *   and the tag tells those apart: user id `ip:1.2.3.4` is `ip%3A1.2.3.4`, never the client at
 *   1.2.3.4, and user id `anon` is never the anonymous namespace;
 * - an encoded segment never contains ',' either (`%2C`), so parts joined with ',' are never a
 *   user id (`['t1', '42']` is `t1,42`, the id `t1,42` is `t1%2C42`), nor other parts;
 * - a request's fingerprint is written `fp=<fingerprint>`, and an encoded client key never holds
 *   '=' (`%3D`): a client key equal to a fingerprint (no secret: a SHA-256 of the request, the
 *   same for every user) keys a record of its own, not the keyless request's (an adversarial
 *   helper: the keyless request was refused 422, or its answer replayed to the keyed one).
 * The guarantee holds for one prefix, as a prefix is one deployment's namespace. Encoding also
 * keeps callers from injecting a Redis Cluster `{hash tag}` to pick a slot.
 */
export function buildStorageKey({ prefix, user, handler, key }: StorageKeyParts): string {
  const userSegment =
    'id' in user
      ? encodeSegment(user.id)
      : 'parts' in user
        ? user.parts.map(encodeSegment).join(',')
        : 'ip' in user
          ? `ip:${encodeSegment(user.ip)}`
          : 'anon:';
  const keySegment = typeof key === 'string' ? encodeSegment(key) : `fp=${encodeSegment(key.fingerprint)}`;
  return `${prefix}:${userSegment}:${encodeSegment(handler)}:${keySegment}`;
}
