import { parseKeyHeader } from './idempotency-key.js';

/** Headers read by `readRequestId` by default, in this order. */
export const REQUEST_ID_HEADERS = Object.freeze(['x-request-id', 'x-idempotency-key']);

/** A request's id: usable, absent (`undefined`), or `invalid` with the reason. */
export type RequestIdHeader = { requestId: string } | { invalid: string } | undefined;

/**
 * Reads the client's request id, chosen once per operation and reused on its retries, from the
 * first of `names` it sends (default `X-Request-Id`, `X-Idempotency-Key`). Each is read like the
 * `Idempotency-Key` header (`"abc"` and `abc` are the same id; 1 to 255 printable characters).
 * Two of them with different values are invalid: which one meant the operation is unknown.
 * Give it the request's `headersDistinct` to refuse a header sent twice: in `headers`, Node joins
 * two bare values into one (`a, b`), read as one id.
 */
export function readRequestId(
  headers: Record<string, string | string[] | undefined>,
  names: readonly string[] = REQUEST_ID_HEADERS,
): RequestIdHeader {
  let found: { name: string; requestId: string } | undefined;
  for (const name of names) {
    const parsed = parseKeyHeader(headers[name.toLowerCase()]);
    if (parsed === undefined) continue;
    if ('invalid' in parsed) return { invalid: `${name}: ${parsed.invalid}` };
    if (found && found.requestId !== parsed.key) return { invalid: `${found.name} and ${name} differ` };
    found ??= { name, requestId: parsed.key };
  }
  return found && { requestId: found.requestId };
}
