import type { Readable } from 'node:stream';
import type { FingerprintFile, FingerprintInput } from '../keys/fingerprint.js';
import { attachedMultipart, isMultipartContentType } from './attached-multipart.js';
import type { HttpRequest } from './http-request.js';
import { uploadedFiles } from './uploaded-files.js';

/** Methods whose bodies Fastify never reads (its defaults; a method an app declares with a body is parsed, and hashed by it). */
const FASTIFY_BODYLESS = new Set(['GET', 'HEAD', 'TRACE']);

/**
 * What the fingerprint of an HTTP request covers: the route (the handler, its path parameters
 * and its host parameters), the query, the body as the parser gave it (or `rawBody`), and the files of a
 * multipart upload: those an upload interceptor put on the request, or those `@fastify/multipart`
 * attached to the body (`attachFieldsToBody`). A promise only when it must wait: a file on disk
 * to hash, or a body no parser read whose end may show it empty.
 */
export function httpFingerprintInput(req: HttpRequest, handler: string): FingerprintInput | Promise<FingerprintInput> {
  const input: FingerprintInput = {
    method: req.method,
    path: handler,
    query: req.query,
    // Always given for a route, so that its query is hashed inside { hosts, params, query }.
    params: req.params ?? {},
    hosts: routeHost(req),
    queryAsSent: queryAsSent(req.url),
    body: req.body,
    rawBody: req.rawBody,
    contentType: req.headers['content-type'] as string | undefined,
    hasBody: carriesBody(req),
  };
  let files = uploadedFiles(req);
  const multipart = 'raw' in req && isMultipartContentType(input.contentType);
  const attached = multipart ? attachedMultipart(req.body) : undefined;
  if (attached) {
    input.body = attached.fields;
    files = withFiles(files, attached.files);
  }
  let unread = input.hasBody && input.body === undefined && input.rawBody === undefined;
  // A form with no part: @fastify/multipart (attachFieldsToBody) read it to its end and attached nothing.
  if (unread && multipart && streamOf(req).readableEnded === true) unread = input.hasBody = false;
  if (!unread && !(files instanceof Promise)) {
    if (files) input.files = files;
    return input;
  }
  return Promise.all([files, unread ? endsEmpty(streamOf(req)) : false]).then(([listed, empty]) => {
    if (listed) input.files = listed;
    if (empty) input.hasBody = false;
    return input;
  });
}

/** Past this many parameters, Node's querystring and qs (Express's parsers, Fastify's choices) drop the rest. */
const PARSED_PARAMETERS = 1000;

/**
 * The query string as sent, where its parser may have lost part of it; undefined otherwise (the
 * parsed query alone counts, and fingerprints stay as they were). Lost: escapes that are not
 * UTF-8, which Node's querystring (Express's default) turns into U+FFFD (`?a=%E9` and `?a=%E8`
 * looked alike: an adversarial helper got a replay where 422 was due), and the parameters past
 * the parsers' 1,000. `url` is the request's own (Express keeps the query in it as routers
 * rewrite the path; Fastify's is the raw URL).
 */
function queryAsSent(url: string | undefined): string | undefined {
  const at = url === undefined ? -1 : url.indexOf('?');
  if (at < 0) return undefined;
  // Most queries hold no escape and are short: nothing to copy or decode.
  if (url!.indexOf('%', at) < 0 && url!.length - at - 1 < PARSED_PARAMETERS) return undefined;
  const query = url!.slice(at + 1);
  if (query.includes('%')) {
    try {
      decodeURIComponent(query);
    } catch {
      return canonicalQuery(query);
    }
  }
  // Each parameter takes a separator at least (an empty one counts against the limit too).
  if (query.length >= PARSED_PARAMETERS && manyParameters(query)) return canonicalQuery(query);
  return undefined;
}

/**
 * The query as sent, in an order of its own: its parameters sorted, the empty ones left out,
 * escapes in upper case. A retry that sends them in another order (`?b=1&a=%E9`), with a
 * trailing `&` or `%e9` is the same request still: the parsed query beside it keeps the order
 * that matters (a list's).
 */
function canonicalQuery(query: string): string {
  return query
    .split('&')
    .filter((part) => part !== '')
    .map((part) => part.replace(/%[0-9a-f]{2}/gi, (escape) => escape.toUpperCase()))
    .sort()
    .join('&');
}

function manyParameters(query: string): boolean {
  let separators = 0;
  for (let at = query.indexOf('&'); at >= 0; at = query.indexOf('&', at + 1)) if (++separators >= PARSED_PARAMETERS) return true;
  return false;
}

/**
 * The host of a host-bound route (`@Controller({ host })`, where Nest's router sets `hosts`), as
 * the router tells hosts apart, in lower case (it matches them so): its host parameters, or the
 * host name where it has none. Undefined for other routes, whose fingerprints stay as they were.
 */
function routeHost(req: HttpRequest): Record<string, string> | string | undefined {
  const { hosts } = req;
  if (hosts === undefined) return undefined;
  let params: Record<string, string> | undefined;
  for (const name in hosts) (params ??= {})[name] = String(hosts[name]).toLowerCase();
  return params ?? String(req.hostname ?? '').toLowerCase();
}

/** The files of an upload interceptor, then those attached to the body. */
function withFiles(
  files: FingerprintFile[] | Promise<FingerprintFile[]> | undefined,
  attached: FingerprintFile[],
): FingerprintFile[] | Promise<FingerprintFile[]> | undefined {
  if (attached.length === 0) return files;
  if (files === undefined) return attached;
  return files instanceof Promise ? files.then((listed) => [...listed, ...attached]) : [...files, ...attached];
}

/**
 * The request carries a body the route may see: `Content-Length` over 0 or `Transfer-Encoding`,
 * on a method its adapter reads bodies of (Fastify never reads a GET's: the route sees none).
 */
function carriesBody(req: HttpRequest): boolean {
  if ('raw' in req && FASTIFY_BODYLESS.has(req.method)) return false;
  return req.headers['transfer-encoding'] !== undefined || Number(req.headers['content-length'] ?? 0) > 0;
}

/** The Node.js request stream: Fastify's `raw`, or the Express request itself. */
function streamOf(req: HttpRequest): Partial<Readable> {
  return ('raw' in req ? (req as { raw: unknown }).raw : req) as Partial<Readable>;
}

/**
 * Whether a body nothing has read ends with zero bytes (a chunked request with no body). Waits
 * for its first byte or its end without reading either, so the handler may still read the
 * stream. False when it has bytes, something else reads it, or it fails.
 */
function endsEmpty(stream: Partial<Readable>): Promise<boolean> {
  if (typeof stream.on !== 'function' || stream.readableFlowing !== null || stream.readableEnded || stream.destroyed) {
    return Promise.resolve(false);
  }
  if (stream.readableLength) return Promise.resolve(false);
  const readable = stream as Readable;
  return new Promise((resolve) => {
    const settle = (empty: boolean) => {
      readable.off('readable', onReadable).off('end', onEnd).off('error', onFail).off('close', onFail);
      resolve(empty);
    };
    // 'readable' comes with the first byte, or at the end with none.
    const onReadable = () => settle(readable.readableLength === 0);
    const onEnd = () => settle(true);
    const onFail = () => settle(false);
    readable.on('readable', onReadable).on('end', onEnd).on('error', onFail).on('close', onFail);
  });
}
