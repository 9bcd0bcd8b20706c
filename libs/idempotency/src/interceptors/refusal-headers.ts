import type { AbstractHttpAdapter } from '@nestjs/core';
import type { OutgoingHttpHeaders, ServerResponse } from 'node:http';
import type { HttpResponse } from './http-request.js';

type HeaderValue = string | number | readonly string[] | undefined;

/**
 * A header a refusal set: its value, the app's value it replaced there (undefined: none), and on
 * Fastify the Node response's own value then (Fastify copies the reply's over it for a stream).
 */
interface RefusalHeader {
  value: string;
  replaced: HeaderValue;
  rawOwn: HeaderValue;
}

/** Where a response keeps headers: the Node.js response's own, or Fastify's reply, which passes its own to `writeHead`. */
type Place = 'raw' | 'reply';

/**
 * What the latest refusal of a request set on its response: the refusal's status, each header
 * (lower-case name) with its value and what it replaced, where it set them, the names the app
 * set since in each place (see `disown`), and whether its answer closes the connection.
 */
interface RefusalHeaders {
  status: number;
  headers: Map<string, RefusalHeader>;
  place: Place;
  /** Each name the app set since, with the value it set last (undefined: removed), per place. */
  setByApp: Record<Place, Map<string, HeaderValue>>;
  /** How often each name was set on the Node response to the reply's own value: Fastify copies it once for a stream. */
  copies: Map<string, number>;
  close: boolean;
}

/** Express's response and Fastify's reply read and remove a header alike. */
type HeaderAccess = Pick<ServerResponse, 'getHeader' | 'removeHeader'>;
/** Fastify's reply sets a header so. */
type Reply = HeaderAccess & { header(name: string, value: unknown): unknown };

const setOn = new WeakMap<ServerResponse, RefusalHeaders>();
/** Responses whose `writeHead` takes refusal headers back and whose header setters are watched: installed once each. */
const hooked = new WeakSet<ServerResponse>();
const JSON_CONTENT_TYPE = 'application/json';
const CONTENT_TYPE = 'content-type';

const mediaTypeOf = (value: unknown) => String(value).split(';', 1)[0].trim().toLowerCase();
/** Still what the refusal set: the same value, or for the type the same media type (the adapter may add a charset). */
const unchanged = (name: string, current: unknown, set: string) =>
  current !== undefined && (name === CONTENT_TYPE ? mediaTypeOf(current) === mediaTypeOf(set) : String(current) === set);

/**
 * Sets a refusal's headers (`Retry-After`, the problem details' Content-Type) on the response
 * before the refusal is thrown, so that whatever exception filter answers it sends them. The
 * refusal may not be the answer, though: an outer `retry()` runs the request again, an outer
 * `catchError` answers with a value of its own. So they are taken back from any answer with
 * another status (`writeHead`), from the answer a later run or replay of the same request gives
 * (`clearRefusalHeaders`), and from what the guard saves (`withoutRefusalHeaders`), except
 * where the app set them itself since (`disown`); a value of the app's they replaced (a
 * middleware's `Retry-After`) is given back. A header the app holds already with the same value
 * is left as the app's.
 */
export function setRefusalHeaders(
  res: HttpResponse,
  raw: ServerResponse,
  adapter: AbstractHttpAdapter,
  status: number,
  headers: Record<string, string>,
  close = false,
): void {
  clearRefusalHeaders(res, raw);
  const names = Object.keys(headers);
  if (names.length === 0 && !close) return;
  const place: Place = (res as object) === raw ? 'raw' : 'reply';
  const set = new Map<string, RefusalHeader>();
  for (const name of names) {
    const lower = name.toLowerCase();
    const replaced = valueIn(res, raw, place, lower);
    const rawOwn = place === 'reply' ? raw.getHeader(lower) : undefined;
    adapter.setHeader(res, name, headers[name]);
    if (lower === CONTENT_TYPE || replaced === undefined || String(replaced) !== headers[name]) set.set(lower, { value: headers[name], replaced, rawOwn });
  }
  setOn.set(raw, { status, headers: set, place, setByApp: { raw: new Map(), reply: new Map() }, copies: new Map(), close });
  if (hooked.has(raw)) return;
  hooked.add(raw);
  takeBackOnOtherStatus(raw);
  watchAppHeaders(res, raw);
}

/**
 * The value of its own a header has in `place`, before the refusal sets it: the Node response's,
 * or the one Fastify's reply would pass to `writeHead` (its `getHeader` answers the Node
 * response's where it has none, which is not its own: that one shows again once the refusal's
 * is taken back from the reply).
 */
function valueIn(res: HttpResponse, raw: ServerResponse, place: Place, name: string): HeaderValue {
  if (place === 'raw') return raw.getHeader(name);
  return raw.hasHeader(name) ? undefined : (res as unknown as HeaderAccess).getHeader(name);
}

/** Gives `name` back its `replaced` value in `place`, or removes it. */
function restore(res: HttpResponse, raw: ServerResponse, place: Place, name: string, replaced: HeaderValue): void {
  if (replaced === undefined) removeFrom(res, raw, place, name);
  else if (place === 'raw') raw.setHeader(name, replaced);
  else (res as unknown as Reply).header(name, replaced);
}

/**
 * Removes `name` from `place`. Fastify's `reply.removeHeader` removes the Node response's too,
 * which is the app's (a middleware's, or code on `reply.raw`): lost, an adversarial helper found,
 * when an outer `retry()` ran the request again. It is put back.
 */
function removeFrom(res: HttpResponse, raw: ServerResponse, place: Place, name: string): void {
  if (place === 'raw') {
    raw.removeHeader(name);
    return;
  }
  const apps = raw.headersSent ? undefined : raw.getHeader(name);
  (res as unknown as Reply).removeHeader(name);
  if (apps !== undefined) raw.setHeader(name, apps);
}

/** Before the same request is run or replayed again: takes back what an earlier refusal set, where still unchanged. */
export function clearRefusalHeaders(res: HttpResponse, raw: ServerResponse): void {
  const set = setOn.get(raw);
  if (!set) return;
  setOn.delete(raw);
  const response = res as unknown as HeaderAccess;
  for (const [name, { value, replaced }] of set.headers) {
    if (name === CONTENT_TYPE) {
      if (unchanged(name, response.getHeader(name), value)) removeFrom(res, raw, set.place, name);
    } else if (!set.setByApp[set.place].has(name) && unchanged(name, (set.place === 'raw' ? raw : response).getHeader(name), value)) {
      restore(res, raw, set.place, name, replaced);
    }
  }
}

/**
 * The headers of an answer with `status`, without those a refusal set on this response when the
 * answer is not that refusal: a `Retry-After` goes (unless the app set one since, anywhere), and
 * a problem details type becomes JSON (the adapter wrote the answer as JSON because the type said
 * JSON). `passed`: the headers Fastify's reply passes to `writeHead`, where its `Retry-After`
 * gets back the value it replaced.
 */
export function withoutRefusalHeaders<T extends OutgoingHttpHeaders | Record<string, string>>(raw: ServerResponse, status: number, headers: T, passed = false): T {
  const set = setOn.get(raw);
  if (!set || set.status === status) return headers;
  for (const name of Object.keys(headers)) {
    const lower = name.toLowerCase();
    const header = set.headers.get(lower);
    if (header === undefined || !unchanged(lower, headers[name], header.value)) continue;
    if (lower === CONTENT_TYPE) {
      (headers as OutgoingHttpHeaders)[name] = asJson(headers[name]);
    } else if (passed) {
      // Fastify's reply holds the refusal's own: its Retry-After, unless the app set one on the reply since.
      if (set.place !== 'reply' || set.setByApp.reply.has(lower)) continue;
      if (header.replaced === undefined) delete headers[name];
      else (headers as OutgoingHttpHeaders)[name] = header.replaced as string;
    } else if (!set.setByApp.raw.has(lower) && !set.setByApp.reply.has(lower)) {
      delete headers[name];
    }
  }
  return headers;
}

/** `application/problem+json; charset=utf-8` as `application/json; charset=utf-8`. */
function asJson(value: unknown): string {
  const text = String(value);
  const end = text.indexOf(';');
  return end < 0 ? JSON_CONTENT_TYPE : `${JSON_CONTENT_TYPE}${text.slice(end)}`;
}

/**
 * On the refusal's own answer, Fastify's reply passes its headers to `writeHead`, over the Node
 * response's: a `Retry-After` the app set on `reply.raw` since, and not on the reply, would lose
 * to the refusal's. The refusal's goes from what is passed.
 */
function givenWay(set: RefusalHeaders, raw: ServerResponse, args: unknown[]): void {
  const passed = args.find((arg): arg is OutgoingHttpHeaders => typeof arg === 'object' && arg !== null && !Array.isArray(arg));
  const apps = (name: string) => set.setByApp.raw.has(name) && !set.setByApp.reply.has(name);
  for (const name of passed ? Object.keys(passed) : []) {
    const lower = name.toLowerCase();
    const header = set.headers.get(lower);
    if (header && apps(lower) && unchanged(lower, passed![name], header.value)) delete passed![name];
  }
  if (!passed) copiedBack(set, raw, (name, header) => apps(name) && unchanged(name, raw.getHeader(name), header.value));
}

/**
 * For a stream, Fastify copies the reply's headers onto the Node response one by one and passes
 * none to `writeHead` (an adversarial helper: the refusal's Retry-After reached a 202 there). A
 * refusal's header that `copied` says Fastify copied over the Node response's gets back the value
 * the app set there since (or its removal), else the one it had at the refusal. Set there twice
 * to the reply's value, it was the app's too (with the refusal's value), and stays.
 */
function copiedBack(set: RefusalHeaders, raw: ServerResponse, copied: (name: string, header: RefusalHeader) => boolean): void {
  for (const [name, header] of set.headers) {
    if (name === CONTENT_TYPE || (set.copies.get(name) ?? 0) > 1 || !copied(name, header)) continue;
    const own = set.setByApp.raw.has(name) ? set.setByApp.raw.get(name) : header.rawOwn;
    if (own === undefined) raw.removeHeader(name);
    else raw.setHeader(name, own);
  }
}

/**
 * Closes the connection after this answer: Node sends `Connection: close` on HTTP/1.1. A
 * `Connection` header the app sets on every answer (`keep-alive`, a middleware's or a Fastify
 * hook's) would keep it open (Node reads it when it writes the head): it says `close` on this
 * one, set on the response or passed to `writeHead`.
 */
function closeAfter(raw: ServerResponse, args: unknown[]): void {
  raw.shouldKeepAlive = false;
  if (raw.getHeader('connection') !== undefined) raw.setHeader('connection', 'close');
  for (const arg of args) {
    if (Array.isArray(arg)) {
      // Flat [name, value, ...] pairs (Node's raw headers form).
      for (let i = 0; i + 1 < arg.length; i += 2) if (String(arg[i]).toLowerCase() === 'connection') arg[i + 1] = 'close';
    } else if (typeof arg === 'object' && arg !== null) {
      for (const name of Object.keys(arg)) if (name.toLowerCase() === 'connection') (arg as Record<string, unknown>)[name] = 'close';
    }
  }
}

/**
 * When the head goes out with another status than the refusal's, takes its headers back: set on
 * the response (Express) or passed to `writeHead` (Fastify). With the refusal's status, closes
 * the connection after it where the refusal says so: Node then sends `Connection: close` on
 * HTTP/1.1 (HTTP/2 has no such header), and on Fastify gives way to what the app set on the Node
 * response since (`givenWay`). Not a header set up front: taken back from another answer,
 * Express's `removeHeader('connection')` left that answer with no Connection header at all.
 * Installed once per response.
 */
function takeBackOnOtherStatus(raw: ServerResponse): void {
  const writeHead = raw.writeHead;
  raw.writeHead = function (this: ServerResponse, ...args: unknown[]) {
    const set = setOn.get(raw);
    if (set && args[0] === set.status) {
      if (set.close) closeAfter(raw, args);
      if (set.place === 'reply') givenWay(set, raw, args);
    } else if (set) {
      for (const [name, { value, replaced }] of set.headers) {
        const current = raw.getHeader(name);
        if (!unchanged(name, current, value)) continue;
        if (name === CONTENT_TYPE) raw.setHeader(name, asJson(current));
        else if (set.place === 'raw' && !set.setByApp.raw.has(name)) restore(raw, raw, 'raw', name, replaced);
      }
      const passed = args.find((arg): arg is OutgoingHttpHeaders => typeof arg === 'object' && arg !== null && !Array.isArray(arg));
      if (passed) withoutRefusalHeaders(raw, args[0] as number, passed, true);
      if (set.place === 'reply' && !passed) copiedBack(set, raw, (name, header) => !set.setByApp.reply.has(name) && unchanged(name, raw.getHeader(name), header.value));
    }
    return (writeHead as (...a: unknown[]) => ServerResponse).apply(this, args);
  } as ServerResponse['writeHead'];
}

/**
 * A header the app sets in `place` after the refusal set it is the app's there from then on,
 * whatever its value: no longer taken back from that place. An exception filter answering the
 * guard's 503 as 429 with its own `Retry-After`, equal to the refusal's, lost it (an adversarial
 * helper): equal values cannot be told apart afterwards. Not the Content-Type: the adapter sets
 * it again itself as it sends the refusal (Express's `res.json()` adds a charset), so it stays
 * judged by its media type.
 */
function disown(raw: ServerResponse, place: Place, name: unknown, value: unknown, reply: HeaderAccess | undefined): void {
  const set = setOn.get(raw);
  if (set === undefined || typeof name !== 'string') return;
  const lower = name.toLowerCase();
  if (lower === CONTENT_TYPE || !set.headers.has(lower)) return;
  // Fastify copying the reply's own value onto the Node response (a stream's answer) is not the app
  // (or is, with the same value, when it happens twice: see copiedBack).
  if (place === 'raw' && reply !== undefined && reply.getHeader(lower) === value) {
    set.copies.set(lower, (set.copies.get(lower) ?? 0) + 1);
    return;
  }
  set.setByApp[place].set(lower, value as HeaderValue);
}

type HeaderSetter = (this: object, name: string, ...rest: unknown[]) => unknown;

/**
 * Tells `disown` of each header the app sets or removes on this response from now on: through
 * Node's `setHeader` and `removeHeader` (Express's `res.set()`, a filter's own call, code on
 * Fastify's `reply.raw`) and, on Fastify, through the reply's `header()` (and `headers()`, which
 * calls it), which keeps its headers apart until `writeHead` and sends them over the Node
 * response's. Each call goes to the
 * setter the response had (its own, or its prototype's at the call: the guard's capture may give
 * an Express response a prototype of its own later), and counts once it went through (a value
 * Node refuses sets nothing). Installed once per response, on refused responses only. The
 * refusal's own headers are set before `setOn` holds them, so they are never taken for the app's.
 */
function watchAppHeaders(res: HttpResponse, raw: ServerResponse): void {
  const reply = (res as object) !== raw && typeof (res as { header?: unknown }).header === 'function' ? (res as unknown as Reply) : undefined;
  telling(raw, 'setHeader', raw, 'raw', reply);
  telling(raw, 'removeHeader', raw, 'raw', undefined);
  if (reply) telling(reply, 'header', raw, 'reply', undefined);
}

/** Puts a setter (or `removeHeader`) on `target` as its own property that makes each call, then tells `disown` of it. */
function telling(target: object, method: string, raw: ServerResponse, place: Place, reply: HeaderAccess | undefined): void {
  const own = Object.hasOwn(target, method) ? ((target as Record<string, unknown>)[method] as HeaderSetter) : undefined;
  (target as Record<string, unknown>)[method] = function (this: object, name: string, value?: unknown, ...rest: unknown[]) {
    const setter = own ?? (Reflect.get(Object.getPrototypeOf(this) as object, method, this) as HeaderSetter);
    const result = method === 'removeHeader' ? setter.call(this, name) : setter.call(this, name, value, ...rest);
    disown(raw, place, name, method === 'removeHeader' ? undefined : value, reply);
    return result;
  };
}
