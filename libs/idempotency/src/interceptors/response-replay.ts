import type { OutgoingHttpHeaders, ServerResponse } from 'node:http';
import { REPLAYED_HEADER } from '../idempotency.constants.js';
import type { SavedResponse } from '../stores/idempotency-store.js';

/**
 * Headers that describe the body the app's pipeline made for a replay, which is not sent; the
 * saved ones (`content-encoding` among them: the saved bytes may be compressed) take their place.
 */
const BODY_HEADERS = ['content-type', 'content-length', 'content-encoding', 'transfer-encoding', 'etag', 'last-modified'];
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
  const body = NO_BODY.has(saved.statusCode) ? Buffer.alloc(0) : savedBytes(saved);
  const writeHead = raw.writeHead;
  const end = raw.end;
  let headed = false;
  const setHead = (pipelineHeaders?: OutgoingHttpHeaders): OutgoingHttpHeaders | undefined => {
    if (headed) return pipelineHeaders;
    headed = true;
    const replaced = new Set([...BODY_HEADERS, ...headerNames]);
    for (const name of replaced) raw.removeHeader(name);
    for (const [name, value] of Object.entries(saved.headers)) raw.setHeader(name, value);
    if (!NO_BODY.has(saved.statusCode)) raw.setHeader('content-length', body.length);
    raw.setHeader(REPLAYED_HEADER, 'true');
    raw.statusCode = saved.statusCode;
    if (!pipelineHeaders) return undefined;
    const kept: OutgoingHttpHeaders = {};
    for (const [name, value] of Object.entries(pipelineHeaders)) {
      if (!replaced.has(name.toLowerCase()) && name.toLowerCase() !== REPLAYED_HEADER.toLowerCase()) kept[name] = value;
    }
    return kept;
  };
  raw.writeHead = function (this: ServerResponse, ...args: unknown[]) {
    const headers = args.find((arg) => typeof arg === 'object' && arg !== null && !Array.isArray(arg)) as
      | OutgoingHttpHeaders
      | undefined;
    const kept = setHead(headers);
    return kept ? writeHead.call(this, saved.statusCode, kept) : writeHead.call(this, saved.statusCode);
  } as ServerResponse['writeHead'];
  raw.write = function (this: ServerResponse, ...args: unknown[]) {
    const callback = args.find((arg) => typeof arg === 'function') as (() => void) | undefined;
    if (callback) process.nextTick(callback);
    return true;
  } as ServerResponse['write'];
  raw.end = function (this: ServerResponse, ...args: unknown[]) {
    const callback = args.find((arg) => typeof arg === 'function') as (() => void) | undefined;
    raw.end = end;
    if (!this.headersSent) setHead();
    return (end as (chunk: Buffer, callback?: () => void) => ServerResponse).call(this, body, callback);
  } as ServerResponse['end'];
}

/** Sends the saved answer at once (for routes where the app sends nothing itself). */
export function sendNow(raw: ServerResponse, saved: SavedResponse, headerNames: readonly string[]): void {
  replayInto(raw, saved, headerNames);
  raw.end();
}
