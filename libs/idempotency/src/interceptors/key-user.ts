import { isIP } from 'node:net';
import type { AnonymousPolicy } from '../idempotency.options.js';
import type { KeyUser } from '../keys/storage-key.js';
import { isUnsafeInteger } from '../keys/idempotency-key.js';
import type { HttpRequest } from './http-request.js';

/**
 * How a user id was read: `'template'`, from the app's `getUser` (which may write it from several
 * fields); `'field'`, as a field of the user holds it (the default lookup: `request.user.id`, else
 * `.sub`, the id the app keys its own data by).
 */
export type IdReading = 'template' | 'field';

/** A message's user: messages have none, so the user segment of their keys is empty (an HTTP request's never is). */
export const MESSAGE_USER: KeyUser = Object.freeze({ id: '' });

/**
 * Whose record an HTTP request's is, from the id `getUser` gave: the user's id; an anonymous
 * request's follows `anonymous` (`'address'` without an address, as on a unix socket, keys it
 * as `'client-key'` does). `undefined` for an authenticated request without a usable id:
 * it is refused, never keyed by address (which many users can share).
 */
export function requestUser(
  id: unknown,
  req: HttpRequest,
  anonymous: AnonymousPolicy,
  properties: readonly string[] = USER,
  reading: IdReading = 'template',
): KeyUser | undefined {
  const user = userOfId(id, () => userObjectOf(req, properties), reading);
  if (user !== undefined) return user;
  // A `getUser` giving the parts of an anonymous call's user gives a list of nothing.
  const none = id === undefined || id === null || id === '' || (Array.isArray(id) && id.every((part) => part === undefined || part === null));
  if (!none || userObjectOf(req, properties) !== undefined) return undefined;
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
 * What a template or `String()` over a missing or wrong field writes, and no real id holds
 * (never vouched for, in an id or in a part): `undefined` (not followed by a letter:
 * `t1undefined`, `T1:UNDEFINED`) or `[object ...]` anywhere; an empty part at either end (`t1:`,
 * `t1,` from `[tenant, id].join()`, `:42`) or two separators in a row (`t1::eu`); white space at
 * either end; the whole text `null`, `NaN`, `None`, `nil`, `(null)`, `{}`, `[]`, `Invalid Date`,
 * `false`, `true` or `Symbol(...)`, as those write it (a name `Nan` is someone's).
 * `getUser: (ctx) => `${user.tenantId}:${user.id}`` over a user without `id` (a JWT user is
 * `{ sub }`) gave every user of a tenant the one segment `t1:undefined`, and one user's answer was
 * replayed to another (adversarial helpers, five rounds).
 */
const NOTHING_ALWAYS = /undefined(?![a-z])|\[object |^[:|,;]|[:|,;#]$|[:|,;]{2}|^\s|\s$/i;
const NOTHING_WHOLE = /^(?:null|NULL|Null|NaN|None|nil|\(null\)|\{\}|\[\]|Invalid Date|false|true|Symbol\(.*\))$/;
const isNothing = (text: string) => NOTHING_ALWAYS.test(text) || NOTHING_WHOLE.test(text);

/**
 * What a template writes for a missing field that real ids also hold, so that the user object
 * may vouch for it (`heldByUser`): `null`, `NaN`, `None`, `nil` or `(null)` between `:`, `|`,
 * `#`, `,`, `;` (`t1:null`, `null:null`; after `[` or `{`, before `]` or `}`: JSON's
 * `["t1",null]`), last after `_`, `-`, `.`, `/` or a space (`t1_null`,
 * `NaN-NaN`: the template's last field missing), or between two of one of `_`, `-`, `/`, a
 * space (`t1-null-eu`; not `.`, which emails' names use, nor two kinds: a nanoid's `-Nil_`). Not first before those (`nan_li@acme.io`,
 * `nan.chen@acme.io`, `NaN-team`, an Azure guest's `null_gmail.com#EXT#@...` are people), nor
 * inside a word run (`V1StGXR8-Nil_dHi6B`). So `null_u1` (a template's first field missing)
 * passes: the parts (`[tenant, sub]`) are the way to key users made of several fields. Each match
 * is the word alone (lookarounds), so that `heldByUser` can tell where it lies.
 */
const NOTHING_WORD = String.raw`(?:null|nan|none|nil|\(null\))`;
const NOTHING_BETWEEN = new RegExp(
  String.raw`(?<=^|[:|#,;[{])${NOTHING_WORD}(?=$|[:|#,;\]}])|(?<=[_\-./\s])${NOTHING_WORD}$|(?<=([_\-/\s]))${NOTHING_WORD}(?=\1)`,
  'i',
);
/** `NOTHING_BETWEEN`, for each of its matches. */
const NOTHING_BETWEEN_ALL = new RegExp(NOTHING_BETWEEN.source, 'gi');
/**
 * The same in a client key, narrower (no owner to ask): the separators `:`, `|`, `#`, `,`, `;`
 * only (`nan_batch_7`, a nanoid's `_nan_` are keys), no empty part (a key the client chose may
 * end with a `:`), and `{}`, `[]`, `Invalid Date` as the whole key.
 */
export const KEY_TEMPLATE_OF_NOTHING = /undefined(?![a-z])|\[object |(?:^|[:|#,;])(?:null|nan)(?:$|[:|#,;])|^(?:\{\}|\[\]|invalid date)$/i;

/**
 * What `String()` (and other languages' templates) write for nothing, exactly: a user's field
 * holding only that vouches for nothing. A name `Nan` does (no template writes it so).
 */
const BARE_NOTHING = /^\s*(?:undefined|null|NULL|NaN|None|nil|\(null\)|\[object \w+\])\s*$/;
/** How many of the user object's texts `heldByUser` reads at most, and of each object property's. */
const MAX_USER_TEXTS = 64;

/**
 * Whether each `NOTHING_BETWEEN` match in `id` is the user's: it lies inside text the request's
 * user object holds (a string property of it, or of an object property one level down) that is
 * only a part of the id, so the id was made of the user's data around it, as `t1:Nan` of
 * `${tenant}:${first}`. A text as long as the id never vouches for it: that is where the id was
 * read (`request.user.id`), and a template's output stored there (Passport's `validate()`
 * returning `{ id: `${tid}:${uid}` }`) vouched for itself, and users merged (a session-21
 * helper). A field that is only `null` or `undefined` vouches for nothing. Without a user object
 * (a `getUser` that reads a header) nothing is held. `NOTHING_ALWAYS` is never held.
 *
 * An id read as the user's field holds (`reading` `'field'`: the default lookup, `request.user.id`
 * or `.sub`, which the app keys its own data by) is the user's also where the word stands after
 * `_`, `-`, `.`, `/` or a space with no field of the user beside it, unless it is the word as a
 * template writes it (`WRITTEN_FOR_NOTHING`): `li_nan` and `Zhang-Nan` are people (the given name
 * Nan), refused 500 on every call before; `acme-null` (a stored `${org}-${uid}` over a missing
 * uid, the org kept nowhere else: the review) and `t1_null` beside a tenant `t1` the user holds
 * are still a template's output.
 */
function vouchedFor(id: string, shorterTexts: () => string[], reading: IdReading): boolean {
  for (const match of id.matchAll(NOTHING_BETWEEN_ALL)) {
    const start = match.index;
    const end = start + match[0].length;
    if (heldAround(id, start, end, shorterTexts())) continue;
    if (reading === 'field' && !WRITTEN_FOR_NOTHING.test(match[0]) && !betweenMarks(id, start, end) && !besideHeldField(id, start, end, shorterTexts())) continue;
    return false;
  }
  return true;
}

/** The words as templates write them, in their case: JavaScript's `null` and `NaN`, Python's `None`, C's `(null)`. */
const WRITTEN_FOR_NOTHING = /^(?:null|NaN|None|\(null\))$/;

/** Whether one of `texts` holds `id`'s `[start, end)`, as a part of the id. */
function heldAround(id: string, start: number, end: number, texts: readonly string[]): boolean {
  return texts.some((text) => {
    for (let at = id.indexOf(text); at !== -1 && at <= start; at = id.indexOf(text, at + 1)) {
      if (at + text.length >= end) return true;
    }
    return false;
  });
}

/** Whether a word at `[start, end)` stands between `:`, `|`, `#`, `,`, `;` (or JSON's brackets) or the id's ends: a template's filler, whoever holds what. */
function betweenMarks(id: string, start: number, end: number): boolean {
  return (start === 0 || MARK_BEFORE.test(id[start - 1]!)) && (end === id.length || MARK_AFTER.test(id[end]!));
}
const MARK_BEFORE = /[:|#,;[{]/;
const MARK_AFTER = /[:|#,;\]}]/;

/** Whether a word after a separator at `start - 1` has a field of the user's just before that separator, or (`t1-null-eu`) just after the same separator following it. */
function besideHeldField(id: string, start: number, end: number, texts: readonly string[]): boolean {
  if (start > 0 && fieldEndsAt(id, start - 1, texts)) return true;
  return end < id.length && id[end] === id[start - 1] && fieldStartsAt(id, end + 1, texts);
}

/** Whether one of `texts` ends at `end` in `id`, after the id's start or a field's edge. */
function fieldEndsAt(id: string, end: number, texts: readonly string[]): boolean {
  return texts.some((text) => end - text.length >= 0 && id.startsWith(text, end - text.length) && (end === text.length || FIELD_EDGE.test(id[end - text.length - 1]!)));
}

/** Whether one of `texts` starts at `start` in `id`, before the id's end or a field's edge. */
function fieldStartsAt(id: string, start: number, texts: readonly string[]): boolean {
  return texts.some((text) => id.startsWith(text, start) && (start + text.length === id.length || FIELD_EDGE.test(id[start + text.length]!)));
}

/** The user object's texts, and those of its object properties, at most `MAX_USER_TEXTS` of each: as they are (an id is written from them verbatim). */
function textsOf(user: object): string[] {
  const texts: string[] = [];
  const add = (value: unknown) => {
    if (typeof value === 'string' && value.trim() !== '' && !BARE_NOTHING.test(value)) texts.push(value);
    // A number is written as its text (a tenant id 7 makes `7-`).
    else if ((typeof value === 'number' && Number.isFinite(value)) || typeof value === 'bigint') texts.push(String(value));
  };
  let read = 0;
  for (const key in user) {
    if (!Object.hasOwn(user, key)) continue;
    if (++read > MAX_USER_TEXTS) break;
    const value = (user as Record<string, unknown>)[key];
    if (value === null || typeof value !== 'object' || Array.isArray(value)) {
      add(value);
      continue;
    }
    let inner = 0;
    for (const name in value) {
      if (!Object.hasOwn(value, name)) continue;
      if (++inner > MAX_USER_TEXTS) break;
      add((value as Record<string, unknown>)[name]);
    }
  }
  return texts;
}

const NO_USER_OBJECT = () => undefined;

/**
 * A user id as its key segment: a non-empty string, a finite number or a bigint. Anything else
 * (an object, a Buffer, an array) has no text that tells every user apart, so it is refused; so
 * is a string that holds what a template writes for a missing field: `NOTHING_ALWAYS`, and
 * `NOTHING_BETWEEN` unless the request's user object holds it (`heldByUser`).
 */
export function idText(id: unknown, userOf: () => unknown = NO_USER_OBJECT, reading: IdReading = 'template'): string | undefined {
  if (typeof id !== 'string') return plainIdText(id);
  // The user object's texts shorter than the id, read once and only for a suspect id.
  let texts: string[] | undefined;
  const shorterTexts = () => (texts ??= shorterTextsOf(id, userOf()));
  if (isNothing(id) || (NOTHING_BETWEEN.test(id) && !vouchedFor(id, shorterTexts, reading)) || emptyFieldAmongHeld(id, shorterTexts)) return undefined;
  return plainIdText(id);
}

/** The texts of the user object (`textsOf`) shorter than `id`: a text as long as the id is where it was read, and vouches for nothing. */
function shorterTextsOf(id: string, user: unknown): string[] {
  if (user === null || typeof user !== 'object') return [];
  return textsOf(user).filter((text) => text.length < id.length);
}

/** A separator at one end with nothing past it (`t1-`, `_42`, `@acme`); real ids end so too (a nanoid's `_`, `-`). */
const LONE_SEPARATOR = /^[-_./#@](.+)$|^(.+)[-_./@]$/s;
/** Two separators in a row, an empty field between (`t1--eu`); a nanoid has `--` and `__` too. */
const DOUBLED_SEPARATOR = /--|__|\.\.|@@|\/\//;
/** What may stand before or after a field in a template's text. */
const FIELD_EDGE = /[-_./:|#,;@+\s]/;

/**
 * Whether the id is the user's fields with an empty one among them: a separator at one end and
 * nothing past it, after (or before) a field the request's user object holds (`[user.tenantId,
 * user.userId].join('-')` over a user without `userId` writes `t1-` for every user of the tenant,
 * and `eu-t1-` with a region first), or two separators in a row beside such a field (`t1--eu`).
 * Numbers count as their text (a tenant id `7` makes `7-`). A real id that ends so, or holds
 * `--` (a nanoid), is no other field of its user (session 21's helpers: such users merged).
 */
function emptyFieldAmongHeld(id: string, shorterTexts: () => string[]): boolean {
  const lone = LONE_SEPARATOR.exec(id);
  const doubled = DOUBLED_SEPARATOR.exec(id);
  if (!lone && !doubled) return false;
  const texts = shorterTexts();
  if (lone?.[2] !== undefined && fieldEndsAt(id, id.length - 1, texts)) return true;
  if (lone?.[1] !== undefined && fieldStartsAt(id, 1, texts)) return true;
  return doubled !== null && (fieldEndsAt(id, doubled.index, texts) || fieldStartsAt(id, doubled.index + 2, texts));
}

/**
 * A part of a user id (`getUser` giving `[user.tenantId, user.sub]`): its text by its type, and
 * never `NOTHING_ALWAYS` (`t1:undefined` stored by a template, an empty text). Not searched for
 * `NOTHING_BETWEEN`: a part is a value as its field holds it, and `nan_li@acme.io` or
 * `li_nan` is a part as it stands.
 */
export function partText(part: unknown): string | undefined {
  return typeof part === 'string' && isNothing(part) ? undefined : plainIdText(part);
}

/** A user id's text by its type alone: a non-empty string, a finite number (an integer within ±2^53) or a bigint. */
export function plainIdText(id: unknown): string | undefined {
  if (typeof id === 'string') return id === '' ? undefined : id;
  // An integer past 2^53 is rounded by a JSON parse: users apart would be one (an adversarial helper).
  if (typeof id === 'number') return Number.isFinite(id) && !isUnsafeInteger(id) ? String(id) : undefined;
  if (typeof id === 'bigint') return String(id);
  return undefined;
}

/** The most parts a user id is made of (`getUser` giving `[tenantId, sub]`): more is a list of something else. */
const MAX_ID_PARTS = 8;

/**
 * The key user of what `getUser` gave: an id (see `idText`), or its parts, each as `partText`
 * takes it (a missing, empty or template-made part refuses the whole: it is no user); one part is
 * that part's id. `'plain'` reads both by their type alone (the admin: an operator names a user the
 * guard keyed). `userOf` gives the request's user object, read only when an id needs it.
 */
export function userOfId(id: unknown, userOf: () => unknown = NO_USER_OBJECT, reading: IdReading | 'plain' = 'template'): KeyUser | undefined {
  const plain = reading === 'plain';
  if (!Array.isArray(id)) {
    const text = plain ? plainIdText(id) : idText(id, userOf, reading);
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
