/** Who a record belongs to: a user id, or for anonymous clients their address. */
export type KeyOwner = { id: string } | { ip: string };

export interface StorageKeyParts {
  prefix: string;
  user: KeyOwner;
  /** `ControllerName.methodName`. */
  handler: string;
  /** The client's key, or the request fingerprint. */
  key: string;
}

/**
 * The store key `<prefix>:<user>:<handler>:<key>`. Each segment is percent-encoded
 * (`encodeURIComponent`, which escapes `:`, `{`, `}` and `%`), so an encoded segment never holds a
 * ':' and decodes to one value only: the key splits back into exactly one triple. An anonymous
 * client's segment is `ip:<encoded address>`, one ':' more than any user id's, so a user whose id
 * is `ip:1.2.3.4` (encoded `ip%3A1.2.3.4`) never meets the client at 1.2.3.4.
 */
export function buildStorageKey({ prefix, user, handler, key }: StorageKeyParts): string {
  const owner = 'id' in user ? encodeURIComponent(user.id) : `ip:${encodeURIComponent(user.ip)}`;
  return `${prefix}:${owner}:${encodeURIComponent(handler)}:${encodeURIComponent(key)}`;
}
