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
  const userObject = userObjectOf(req, properties);
  const user = userOfId(id, userObject);
  if (user !== undefined) return user;
  if (userObject || (id !== undefined && id !== null && id !== '')) return undefined;
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

/** What separates the parts of a template's text (`${tenant}:${id}`, `[tenant, id].join()`, `${t}-${id}`). */
const SEP = String.raw`[:_|#,;/.\-\s]`;

/**
 * What a template or `String()` over a missing or wrong field writes: `undefined` (not followed
 * by a letter: `t1undefined`, `T1:UNDEFINED`) or `[object ...]` anywhere; `null`, `NaN`, `None`,
 * `nil` or `(null)` as a part between separators (`:`, `_`, `|`, `#`, `,`, `;`, `/`, `.`, `-`,
 * spaces) or as the whole id; an empty part at either end (`t1:`, `t1,` from
 * `[tenant, id].join()`, `:42`); `{}`, `[]`, `Invalid Date`, `false`, `true`, `Symbol(...)` as the
 * whole id; white space at either end. `getUser: (ctx) => `${user.tenantId}:${user.id}`` over a
 * user without `id` (a JWT user is `{ sub }`) gave every user of a tenant the one segment
 * `t1:undefined`, and one user's answer was replayed to another (adversarial helpers, four
 * rounds). Some real ids have such text (`nan_li@acme.io`, an Azure guest's
 * `null_gmail.com#EXT#@...`): see `heldByUser`. Each match is the suspect text alone (lookarounds), so
 * that `heldByUser` can tell where it lies.
 */
const TEMPLATE_OF_NOTHING = new RegExp(
  String.raw`undefined(?![a-z])|\[object |(?<=^|${SEP})(?:null|nan|none|nil|\(null\))(?=$|${SEP})|^[:|,;]|[:|,;#]$|^(?:\{\}|\[\]|invalid date|false|true|symbol\(.*\))$|^\s|\s$`,
  'i',
);
/** `TEMPLATE_OF_NOTHING`, for each of its matches. */
const TEMPLATE_MATCHES = new RegExp(TEMPLATE_OF_NOTHING.source, 'gi');
/**
 * The same in a client key, narrower (no owner to ask, see `heldByUser`): the separators `:`,
 * `|`, `#`, `,`, `;` only (`nan_batch_7`, a nanoid's `_nan_` are keys), no empty part (a key
 * the client chose may end with a `:`), and `{}`, `[]`, `Invalid Date` as the whole key.
 */
export const KEY_TEMPLATE_OF_NOTHING = /undefined(?![a-z])|\[object |(?:^|[:|#,;])(?:null|nan)(?:$|[:|#,;])|^(?:\{\}|\[\]|invalid date)$/i;

/**
 * What `String()` (and other languages' templates) write for nothing, exactly: a user's field
 * holding only that vouches for nothing. A name `Nan` does (no template writes it so).
 */
const BARE_NOTHING = /^\s*(?:undefined|null|NULL|NaN|None|nil|\(null\)|\[object \w+\])\s*$/;
/** How many of the user object's texts `heldByUser` reads at most. */
const MAX_USER_TEXTS = 64;

/**
 * Whether every suspect part of `id` (`TEMPLATE_OF_NOTHING`'s matches) lies inside text the
 * request's user object holds (a string property of it, or of an object property one level
 * down) that is only a part of the id: then the id was made of the user's data around it, as
 * `t1:nan_li@acme.io` of `${tenant}:${email}`. A text as long as the id never vouches for it:
 * that is where the id was read (`request.user.id`), and a template's output stored there
 * (Passport's `validate()` returning `{ id: `${tid}:${uid}` }`) vouched for itself, and users
 * merged (a session-21 helper). A field that is only `null` or `undefined` vouches for nothing.
 * Without a user object (a `getUser` that reads a header) nothing is held. An id that is such
 * text whole (`nan_li@acme.io`) is given as one part (`[user.email]`; see `partText`).
 */
function heldByUser(id: string, user: unknown): boolean {
  if (user === null || typeof user !== 'object') return false;
  const texts = textsOf(user).filter((text) => text.length < id.length);
  for (const match of id.matchAll(TEMPLATE_MATCHES)) {
    const start = match.index;
    const end = start + match[0].length;
    const held = texts.some((text) => {
      for (let at = id.indexOf(text); at !== -1 && at <= start; at = id.indexOf(text, at + 1)) {
        if (at + text.length >= end) return true;
      }
      return false;
    });
    if (!held) return false;
  }
  return true;
}

/** The user object's texts, and those of its object properties, up to `MAX_USER_TEXTS`: as they are (an id is written from them verbatim). */
function textsOf(user: object): string[] {
  const texts: string[] = [];
  const add = (value: unknown) => {
    if (typeof value === 'string' && value.length > 1 && !BARE_NOTHING.test(value)) texts.push(value);
  };
  for (const value of Object.values(user)) {
    if (texts.length >= MAX_USER_TEXTS) break;
    if (value !== null && typeof value === 'object' && !Array.isArray(value)) {
      for (const inner of Object.values(value as object).slice(0, MAX_USER_TEXTS)) add(inner);
    } else {
      add(value);
    }
  }
  return texts;
}

/**
 * A user id as its key segment: a non-empty string, a finite number or a bigint. Anything else
 * (an object, a Buffer, an array) has no text that tells every user apart, so it is refused; so
 * is a string that holds what a template writes for a missing field (`t1:undefined`), unless
 * the request's user object holds that text (`heldByUser`).
 */
export function idText(id: unknown, user?: unknown): string | undefined {
  if (typeof id === 'string' && TEMPLATE_OF_NOTHING.test(id) && !heldByUser(id, user)) return undefined;
  return plainIdText(id);
}

/**
 * What `String()` (and other languages) write for nothing, as a whole part, or white space only:
 * a part is a value as its field holds it, never a template's output, so only these are refused.
 */
const PART_OF_NOTHING = /^\s*(?:undefined|null|NULL|NaN|None|nil|\(null\)|\[object \w+\]|Invalid Date)?\s*$/;

/**
 * A part of a user id (`getUser` giving `[user.tenantId, user.sub]`): its text by its type, and
 * not `PART_OF_NOTHING`. Not searched for a template's output: parts are what a template would be
 * made of, and `nan_li@acme.io` is a part as it stands.
 */
export function partText(part: unknown): string | undefined {
  return typeof part === 'string' && PART_OF_NOTHING.test(part) ? undefined : plainIdText(part);
}

/** A user id's text by its type alone: a non-empty string, a finite number or a bigint. */
export function plainIdText(id: unknown): string | undefined {
  if (typeof id === 'string') return id === '' ? undefined : id;
  if (typeof id === 'number') return Number.isFinite(id) ? String(id) : undefined;
  if (typeof id === 'bigint') return String(id);
  return undefined;
}

/** The most parts a user id is made of (`getUser` giving `[tenantId, sub]`): more is a list of something else. */
const MAX_ID_PARTS = 8;

/**
 * The key user of what `getUser` gave: an id (see `idText`), or its parts, each as `partText`
 * takes it (a missing, empty or nothing-word part refuses the whole: it is no user); one part is
 * that part's id. `plain` reads both by their type alone (the admin: an operator names a user
 * the guard keyed).
 */
export function userOfId(id: unknown, user?: unknown, plain = false): KeyUser | undefined {
  if (!Array.isArray(id)) {
    const text = plain ? plainIdText(id) : idText(id, user);
    return text === undefined ? undefined : { id: text };
  }
  if (id.length === 0 || id.length > MAX_ID_PARTS) return undefined;
  const parts: string[] = [];
  for (const part of id) {
    const text = plain ? plainIdText(part) : partText(part);
    if (text === undefined) return undefined;
    parts.push(text);
  }
  return parts.length === 1 ? { id: parts[0]! } : { parts };
}

const USER: readonly string[] = ['user'];

/**
 * The request's user: the first of `properties` set (`user`, and any other `property` Passport
 * was registered with, see `UserLocation`), on Nest's request, else (Fastify) on its Node.js
 * request, where Nest middleware, which Fastify hands the Node.js request, puts it. `false` is
 * Passport's "no user" (an optional sign-in without a token sets `request.account = false`): not
 * set. Taken for the user, it hid the API client another guard put on `request.user`, and one
 * client was replayed another's answer (an adversarial helper).
 */
export function userObjectOf(req: HttpRequest | undefined, properties: readonly string[] = USER): unknown {
  const holder = req as (Record<string, unknown> & { raw?: Record<string, unknown> }) | undefined;
  for (let i = 0; i < properties.length; i++) {
    const name = properties[i]!;
    const user = isSet(holder?.[name]) ? holder![name] : holder?.raw?.[name];
    if (isSet(user)) return user;
  }
  return undefined;
}

/** `false` and `''`: a property set to say there is no user (`0` is an id). */
const isSet = (user: unknown) => user !== undefined && user !== null && user !== false && user !== '';
