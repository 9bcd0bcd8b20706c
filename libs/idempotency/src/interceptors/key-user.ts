import { isIP } from 'node:net';
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
  const user = userOfId(id);
  if (user !== undefined) return user;
  if (userObjectOf(req, properties) || (id !== undefined && id !== null && id !== '')) return undefined;
  // No address (a unix socket; a proxy's `unknown` or `_hidden`): keyed as under 'client-key',
  // never as one shared address, under which every caller's same request was one.
  const ip = anonymous === 'address' ? addressOf(req.ip) : undefined;
  return ip === undefined ? { anonymous: true } : { ip };
}

/** An address with a port: IPv4 `a.b.c.d:port`, or IPv6 in brackets `[...]:port`. */
const WITH_PORT = /^(?:(\d{1,3}(?:\.\d{1,3}){3})|\[([0-9A-Fa-f:.%\w]+)\]):\d{1,5}$/;

/**
 * A client address as one text per address (its port, where a proxy wrote one, left out), or undefined for what is none (empty, `unknown`,
 * `_hidden`, anything but an IP address): IPv6 in its short lower-case form, and an IPv4-mapped
 * IPv6 address (`::ffff:198.51.100.7`, what a dual-stack server reports) as its IPv4 address.
 */
export function addressOf(given: string | undefined): string | undefined {
  if (!given) return undefined;
  // Some load balancers write the client's port too (`10.0.0.1:1234`, `[2001:db8::1]:80`).
  const ip = isIP(given) ? given : (WITH_PORT.exec(given)?.slice(1).find(Boolean) ?? given);
  const version = isIP(ip);
  if (version === 4) return ip;
  if (version !== 6) return undefined;
  let short: string;
  try {
    // The URL parser writes an IPv6 host in its canonical form (RFC 5952).
    short = new URL(`http://[${ip}]/`).hostname.slice(1, -1);
  } catch {
    return ip.toLowerCase(); // a zone index (fe80::1%eth0), which URLs do not take
  }
  const mapped = /^::ffff:([0-9a-f]{1,4}):([0-9a-f]{1,4})$/.exec(short);
  if (!mapped) return short;
  const [high, low] = [parseInt(mapped[1]!, 16), parseInt(mapped[2]!, 16)];
  return `${high >> 8}.${high & 255}.${low >> 8}.${low & 255}`;
}

/**
 * What a template or `String()` over a missing or wrong field writes: `undefined` (not followed
 * by a letter: `t1undefined`, `T1:UNDEFINED`) or `[object ...]` anywhere; `null` or `NaN` as a
 * part between template separators (`:`, `_`, `|`, `#`, `,`, `;`) or as the whole id; an empty
 * part at either end (`t1:`, `:42`, `|42`). `getUser: (ctx) => `${user.tenantId}:${user.id}``
 * over a user without `id` (a JWT user is `{ sub }`) gave every user of a tenant the one segment
 * `t1:undefined`, and one user's answer was replayed to another (adversarial helpers, two
 * rounds). Narrow on purpose: an email (`dev.null@acme.io`), a base64 id (`/x9...`) or a name
 * (`NaN-team`) is someone's id (a third round).
 */
export const TEMPLATE_OF_NOTHING = /undefined(?![a-z])|\[object |(?:^|[:_|#,;])(?:null|nan)(?:$|[:_|#,;])|^[:|]|[:|]$/i;
/** The same in a client key, but an empty part: a key the client chose may end with a `:`. */
export const KEY_TEMPLATE_OF_NOTHING = /undefined(?![a-z])|\[object |(?:^|[:_|#,;])(?:null|nan)(?:$|[:_|#,;])/i;

/**
 * A user id as its key segment: a non-empty string, a finite number or a bigint. Anything else
 * (an object, a Buffer, an array) has no text that tells every user apart, so it is refused; so
 * is a string that holds what a template writes for a missing field (`t1:undefined`).
 */
export function idText(id: unknown): string | undefined {
  if (typeof id === 'string') return id === '' || TEMPLATE_OF_NOTHING.test(id) ? undefined : id;
  if (typeof id === 'number') return Number.isFinite(id) ? String(id) : undefined;
  if (typeof id === 'bigint') return String(id);
  return undefined;
}

/** The most parts a user id is made of (`getUser` giving `[tenantId, sub]`): more is a list of something else. */
const MAX_ID_PARTS = 8;

/**
 * The key user of what `getUser` gave: an id (see `idText`), or its parts, each an id as
 * `idText` takes it (a missing, empty or template-made part refuses the whole: it is no user);
 * one part is that part's id.
 */
export function userOfId(id: unknown): KeyUser | undefined {
  if (!Array.isArray(id)) {
    const text = idText(id);
    return text === undefined ? undefined : { id: text };
  }
  if (id.length === 0 || id.length > MAX_ID_PARTS) return undefined;
  const parts: string[] = [];
  for (const part of id) {
    const text = idText(part);
    if (text === undefined) return undefined;
    parts.push(text);
  }
  return parts.length === 1 ? { id: parts[0]! } : { parts };
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
