import type { RequestHeaders } from './header-lines.js';
import { parseKeyHeader, readKeyHeader } from './idempotency-key.js';

/** Headers read by `readRequestId` by default, in this order. */
export const REQUEST_ID_HEADERS = Object.freeze(['x-request-id', 'x-idempotency-key']);

/** A request's id: usable, absent (`undefined`), or `invalid` with the reason. */
export type RequestIdHeader = { requestId: string } | { invalid: string } | undefined;

/**
 * Reads the client's request id, chosen once per operation and reused on its retries, from the
 * first of `names` it sends (default `X-Request-Id`, `X-Idempotency-Key`). Each is read like the
 * `Idempotency-Key` header (`"abc"` and `abc` are the same id; 1 to 255 printable characters).
 * Two of them with different values are invalid: which one meant the operation is unknown, and
 * so is a header sent on two lines.
 *
 * @param source the request (Express, Fastify, Node.js, HTTP/2), read as `readKeyHeader` reads
 *   it: a header sent on two lines is refused; or headers (`headersDistinct` tells two lines
 *   too; in `headers`, Node joins two lines into one value, `r1, r1`, an id of its own: an
 *   adversarial helper, on the demo's uploads)
 */
export function readRequestId(
  source: RequestHeaders | Record<string, string | string[] | undefined>,
  names: readonly string[] = REQUEST_ID_HEADERS,
): RequestIdHeader {
  // A request has its headers as an object; a header's value is text or a list of texts.
  const request = typeof source.headers === 'object' && !Array.isArray(source.headers) ? (source as RequestHeaders) : undefined;
  let found: { name: string; requestId: string } | undefined;
  for (const name of names) {
    const parsed = request ? readKeyHeader(request, name) : parseKeyHeader((source as Record<string, string | string[] | undefined>)[name.toLowerCase()]);
    if (parsed === undefined) continue;
    if ('invalid' in parsed) return { invalid: `${name}: ${parsed.invalid}` };
    if (found && found.requestId !== parsed.key) return { invalid: `${found.name} and ${name} differ` };
    found ??= { name, requestId: parsed.key };
  }
  return found && { requestId: found.requestId };
}
