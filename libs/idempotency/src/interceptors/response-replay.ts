import type { OutgoingHttpHeaders, ServerResponse } from 'node:http';
import { REPLAYED_HEADER } from '../idempotency.constants.js';
import type { SavedResponse } from '../stores/idempotency-store.js';
import { decodedForRequest } from './content-coding.js';
import { hookResponse, namesSetOn } from './response-hooks.js';

/**
 * Headers that describe the body the app's pipeline made for a replay, which is not sent; the
 * saved ones (`content-encoding` among them: the saved bytes may be compressed) take their place.
 */
const BODY_HEADERS = ['content-type', 'content-length', 'content-encoding', 'transfer-encoding', 'etag', 'last-modified'];
/** The headers a replay replaces, per list of saved header names (the module's, made once). */
const replacedSets = new WeakMap<readonly string[], ReadonlySet<string>>();
function replacedBy(headerNames: readonly string[]): ReadonlySet<string> {
  let replaced = replacedSets.get(headerNames);
  if (!replaced) replacedSets.set(headerNames, (replaced = new Set([...BODY_HEADERS, ...headerNames])));
  return replaced;
}
/** `Idempotent-Replayed`, as a lower-case name. */
const REPLAYED_NAME = REPLAYED_HEADER.toLowerCase();
/** Statuses whose responses carry no body. */
const NO_BODY = new Set([204, 205, 304]);

/** The saved body's bytes. */
export function savedBytes(saved: SavedResponse): Buffer {
  if (saved.body === undefined) return Buffer.alloc(0);
  return Buffer.from(saved.body, saved.encoding === 'base64' ? 'base64' : 'utf8');
}

/**
 * Makes the Node.js response of a duplicate send the saved answer, whatever the app's pipeline
 * (interceptors, serializers, filters) makes of the value it is given: the status, the saved
 * headers and the saved bytes replace the pipeline's own; headers the pipeline adds that do not
 * describe the body (CORS, request ids) stay. Used where the app sends the answer; `sendNow`
 * where it does not (`@Res()` handlers).
 */
export function replayInto(raw: ServerResponse, saved: SavedResponse, headerNames: readonly string[]): void {
  let body = NO_BODY.has(saved.statusCode) ? Buffer.alloc(0) : savedBytes(saved);
  let savedHeaders = saved.headers;
  if (NO_BODY.has(saved.statusCode) && savedHeaders['content-encoding'] !== undefined) {
    // No body goes out, so no coding of one (a plugin with no threshold gzips a 205's empty answer).
    const { 'content-encoding': _coding, ...rest } = savedHeaders;
    savedHeaders = rest;
  }
  // Compressed bytes (a compression plugin that runs before the response, as Fastify's do) go
  // out decoded to a request that does not accept their coding, and vary with Accept-Encoding.
  const coding = savedHeaders['content-encoding'];
  if (coding !== undefined && body.length > 0) {
    const decoded = decodedForRequest(body, coding, acceptEncodingOf(raw));
    if (decoded) {
      body = decoded;
      const { 'content-encoding': _coding, ...rest } = savedHeaders;
      savedHeaders = rest;
    }
  }
  let headed = false;
  let ended = false;
  /** True while the saved bytes go out: a write the response's own end() makes is theirs (light-my-request's end(data) writes through this.write()). */
  let sending = false;
  const setHead = (res: ServerResponse, pipelineHeaders?: OutgoingHttpHeaders): OutgoingHttpHeaders | undefined => {
    if (headed) return pipelineHeaders;
    headed = true;
    // Vary names what the answer depends on: the saved answer's (the handler's, a compression's),
    // this response's pipeline's (CORS's Origin), and Accept-Encoding for coded bytes. Fastify
    // passes its headers to writeHead, where they overrode one set on the response (an
    // adversarial helper: a gzip replay without `Vary: Accept-Encoding` behind CORS).
    const replaced = replacedBy(headerNames);
    const listed = namesSetOn(res);
    const present = listed ?? [...replaced].filter((name) => res.hasHeader(name));
    const vary = unionVary([
      listed === undefined || listed.includes('vary') ? res.getHeader('vary') : undefined,
      pipelineHeaders && headerIn(pipelineHeaders, 'vary'),
      savedHeaders.vary,
      coding !== undefined ? 'accept-encoding' : undefined,
    ]);
    // Only headers that are set: Node remembers a removed Transfer-Encoding, and a response whose
    // Content-Length a compression middleware then removes would go out unframed, ended by
    // closing a keep-alive connection.
    for (const name of present) if (replaced.has(name)) res.removeHeader(name);
    for (const [name, value] of Object.entries(savedHeaders)) if (name !== 'vary') res.setHeader(name, value);
    if (vary) res.setHeader('vary', vary);
    else if (res.hasHeader('vary')) res.removeHeader('vary');
    // 205 too, with a zero length: Node gives it a body, unlike 204 and 304, and without a length
    // (removed by Express for its own 205) the replay ended by closing a keep-alive connection.
    if (!NO_BODY.has(saved.statusCode)) res.setHeader('content-length', body.length);
    else if (saved.statusCode === 205) res.setHeader('content-length', 0);
    res.setHeader(REPLAYED_HEADER, 'true');
    res.statusCode = saved.statusCode;
    if (!pipelineHeaders) return undefined;
    const kept: OutgoingHttpHeaders = {};
    for (const [name, value] of Object.entries(pipelineHeaders)) {
      const lower = name.toLowerCase();
      if (!replaced.has(lower) && lower !== 'vary' && lower !== REPLAYED_NAME) kept[name] = value;
    }
    return kept;
  };
  const through = hookResponse(raw, {
    writeHead(res, args) {
      const headers = args.find((arg) => typeof arg === 'object' && arg !== null && !Array.isArray(arg)) as
        | OutgoingHttpHeaders
        | undefined;
      const kept = setHead(res, headers);
      return kept ? through.writeHead.call(res, saved.statusCode, kept) : through.writeHead.call(res, saved.statusCode);
    },
    write(res, args) {
      if (sending) return (through.write as (...a: unknown[]) => boolean).apply(res, args);
      const callback = args.find((arg) => typeof arg === 'function') as (() => void) | undefined;
      if (callback) process.nextTick(callback);
      return true;
    },
    end(res, args) {
      // A second end() is Node's to answer, as it was before the replay.
      if (ended) return (through.end as (...a: unknown[]) => ServerResponse).apply(res, args);
      ended = true;
      const callback = args.find((arg) => typeof arg === 'function') as (() => void) | undefined;
      if (!res.headersSent) setHead(res);
      sending = true;
      try {
        return (through.end as (chunk: Buffer, callback?: () => void) => ServerResponse).call(res, body, callback);
      } finally {
        sending = false;
      }
    },
  });
}

function acceptEncodingOf(raw: ServerResponse): string | undefined {
  const value = (raw as { req?: { headers?: Record<string, string | string[] | undefined> } }).req?.headers?.['accept-encoding'];
  return Array.isArray(value) ? value.join(',') : value;
}

type HeaderValue = number | string | readonly string[] | undefined;

/** A header of `writeHead`'s object, whatever the case of its name. */
function headerIn(headers: OutgoingHttpHeaders, name: string): HeaderValue {
  for (const key of Object.keys(headers)) if (key.toLowerCase() === name) return headers[key] as HeaderValue;
  return undefined;
}

/** One `Vary` value naming every field the given ones name, each once (`*` alone where one says `*`); empty when none. */
function unionVary(values: HeaderValue[]): string {
  const names: string[] = [];
  const seen = new Set<string>();
  for (const value of values) {
    if (value === undefined) continue;
    for (const part of (Array.isArray(value) ? value.join(',') : String(value)).split(',')) {
      const name = part.trim();
      if (name === '*') return '*';
      const lower = name.toLowerCase();
      if (name && !seen.has(lower)) {
        seen.add(lower);
        names.push(name);
      }
    }
  }
  return names.join(', ');
}

/** Sends the saved answer at once (for routes where the app sends nothing itself). */
export function sendNow(raw: ServerResponse, saved: SavedResponse, headerNames: readonly string[]): void {
  replayInto(raw, saved, headerNames);
  raw.end();
}
