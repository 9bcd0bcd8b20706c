import type { AnonymousPolicy } from '../idempotency.options.js';
import type { KeyUser } from '../keys/storage-key.js';
import type { HttpRequest } from './http-request.js';

/** A message's user: messages have none, so the user segment of their keys is empty (an HTTP request's never is). */
export const MESSAGE_USER: KeyUser = Object.freeze({ id: '' });

/**
 * Whose record an HTTP request's is, from the id `getUser` gave: the user's id; an anonymous
 * request's follows `anonymous` (`'address'` without an address, as on a unix socket, keys it
 * as `'client-key'` does). `undefined` for an authenticated request without a usable id:
 * it is refused, never keyed by address (which many users can share).
 */
export function requestUser(id: unknown, req: HttpRequest, anonymous: AnonymousPolicy, properties: readonly string[] = USER): KeyUser | undefined {
  const text = idText(id);
  if (text !== undefined) return { id: text };
  if (userObjectOf(req, properties) || (id !== undefined && id !== null && id !== '')) return undefined;
  // No address (a unix socket): keyed as under 'client-key', never as one shared address
  // ('unknown'), under which every caller's same request was one.
  return anonymous === 'address' && req.ip ? { ip: req.ip } : { anonymous: true };
}

/**
 * A user id as its key segment: a non-empty string, a finite number or a bigint. Anything else
 * (an object, a Buffer, an array) has no text that tells every user apart, so it is refused.
 */
export function idText(id: unknown): string | undefined {
  if (typeof id === 'string') return id === '' ? undefined : id;
  if (typeof id === 'number') return Number.isFinite(id) ? String(id) : undefined;
  if (typeof id === 'bigint') return String(id);
  return undefined;
}

const USER: readonly string[] = ['user'];

/**
 * The request's user: the first of `properties` set (`user`, and any other `property` Passport
 * was registered with, see `UserLocation`), on Nest's request, else (Fastify) on its Node.js
 * request, where Nest middleware, which Fastify hands the Node.js request, puts it.
 */
export function userObjectOf(req: HttpRequest | undefined, properties: readonly string[] = USER): unknown {
  const holder = req as (Record<string, unknown> & { raw?: Record<string, unknown> }) | undefined;
  for (let i = 0; i < properties.length; i++) {
    const user = holder?.[properties[i]!] ?? holder?.raw?.[properties[i]!];
    if (user !== undefined && user !== null) return user;
  }
  return undefined;
}
