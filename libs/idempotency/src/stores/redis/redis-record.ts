import type { SavedResponse, StoredRecord } from '../idempotency-store.js';

/**
 * One idempotency record as one Redis string, so that a claim is a single `SET ... NX PX GET`
 * (no script) and a duplicate reads everything in that one reply.
 *
 * - processing: `P` + the head `[token, fingerprint, leaseEndMs]` (JSON; `leaseEndMs` by the
 *   holder's clock, at the claim or its last renewal, only for a duplicate's hint). `W` instead of `P`
 *   once a waiting duplicate marked it (`claim-wait.lua`): complete and release then publish.
 * - completed: `C` + the same head + `\n` + the meta `[statusCode, headers]` (JSON), then, when
 *   the response has a body, `\n` and the body text as saved. The meta has a third element,
 *   `{ encoding?, unreplayable? }`, only when the response sets one of them, so a plain response
 *   is written as before and a record written before that element existed still decodes. The
 *   complete script writes the record from the processing record's head and the caller's
 *   {@link encodeResponse}.
 *
 * `JSON.stringify` never writes a raw newline, so the first two `\n` end the JSON parts. The
 * scripts compare the head's first element with the caller's token ({@link tokenPrefix}) and
 * never parse the rest; renewing replaces what follows the head's last comma (`leaseEndMs`, a
 * number, so no comma of the token or fingerprint can come after it).
 */
export type DecodedRecord =
  | { state: 'processing'; token: string; fingerprint: string; leaseEndMs: number }
  | { state: 'completed'; token: string; fingerprint: string; response: SavedResponse };

type Head = [token: string, fingerprint: string, leaseEndMs: number];

/** The optional fields of a `SavedResponse`, as the meta's optional third element. */
type Flags = Pick<SavedResponse, 'encoding' | 'unreplayable'>;
type Meta = [statusCode: number, headers: Record<string, string>, flags?: Flags];

const COMPLETED = 'C'.charCodeAt(0);
const PROCESSING = 'P'.charCodeAt(0);
const WATCHED = 'W'.charCodeAt(0);

/** Strings JSON writes as they are, between quotes (the guard's tokens and hex fingerprints). */
const PLAIN = /^[\w.:-]*$/;
const quoted = (text: string) => (PLAIN.test(text) ? `"${text}"` : JSON.stringify(text));

export function encodeProcessing(token: string, fingerprint: string, leaseEndMs: number): string {
  // What JSON.stringify([token, fingerprint, leaseEndMs]) writes, without building the array.
  return `P[${quoted(token)},${quoted(fingerprint)},${JSON.stringify(leaseEndMs)}]`;
}

/**
 * The part of a completed record after the head: `[statusCode, headers]` (plus the flags, when
 * set), then `\n` + body.
 */
export function encodeResponse(response: SavedResponse): string {
  const { statusCode, headers, encoding, unreplayable } = response;
  const meta = JSON.stringify(
    encoding === undefined && unreplayable === undefined
      ? [statusCode, headers]
      : [statusCode, headers, { encoding, unreplayable }],
  );
  return response.body === undefined ? meta : `${meta}\n${response.body}`;
}

/** How a head owned by `token` starts: `["<token>",`. */
export function tokenPrefix(token: string): string {
  return `[${quoted(token)},`;
}

/**
 * A record as the store wrote it; throws for any other value (in a Redis the app shares, a value
 * that only starts as a record does: its shape is checked, or the admin's inspect failed 500 on
 * its null headers, an adversarial helper).
 */
export function decodeRecord(value: string): DecodedRecord {
  const state = value.charCodeAt(0);
  if (state === PROCESSING || state === WATCHED) {
    const [token, fingerprint, leaseEndMs] = headOf(JSON.parse(value.slice(1)));
    if (typeof leaseEndMs !== 'number') throw new Error('not an idempotency record (a claim without its lease end)');
    return { state: 'processing', token, fingerprint, leaseEndMs };
  }
  if (state !== COMPLETED) throw new Error(`not an idempotency record (starts with ${JSON.stringify(value.slice(0, 1))})`);
  const headEnd = value.indexOf('\n');
  const metaEnd = value.indexOf('\n', headEnd + 1);
  const [token, fingerprint] = headOf(JSON.parse(value.slice(1, headEnd)));
  const [statusCode, headers, flags] = metaOf(JSON.parse(value.slice(headEnd + 1, metaEnd === -1 ? undefined : metaEnd)));
  const response: SavedResponse = { statusCode, headers };
  if (metaEnd !== -1) response.body = value.slice(metaEnd + 1);
  if (flags?.encoding !== undefined) response.encoding = flags.encoding;
  if (flags?.unreplayable !== undefined) response.unreplayable = flags.unreplayable;
  return { state: 'completed', token, fingerprint, response };
}

function headOf(parsed: unknown): Head {
  if (!Array.isArray(parsed) || typeof parsed[0] !== 'string' || typeof parsed[1] !== 'string') {
    throw new Error('not an idempotency record (its head is no token and fingerprint)');
  }
  return parsed as Head;
}

function metaOf(parsed: unknown): Meta {
  const [statusCode, headers, flags] = Array.isArray(parsed) ? (parsed as unknown[]) : [];
  const fits =
    Number.isInteger(statusCode) &&
    // 0: a message handler's answer (no HTTP status); else what Node sends: 100 to 999 (a 7xx
    // record refused here made every duplicate an outage: 503, or a run again where fail-open).
    (statusCode === 0 || ((statusCode as number) >= 100 && (statusCode as number) <= 999)) &&
    typeof headers === 'object' &&
    headers !== null &&
    !Array.isArray(headers) &&
    Object.values(headers).every((header) => typeof header === 'string') &&
    (flags === undefined || (typeof flags === 'object' && flags !== null));
  if (!fits) throw new Error('not an idempotency record (its status and headers are not an answer)');
  return parsed as Meta;
}

export function toStoredRecord(record: DecodedRecord, ttlMs: number): StoredRecord {
  const { token, fingerprint } = record;
  return record.state === 'completed'
    ? { state: 'completed', token, fingerprint, response: record.response, ttlMs }
    : { state: 'processing', token, fingerprint, ttlMs };
}

