/** Table of `PostgresOutcomeRecorder`, as `IdempotencyOutcomes1764547200000` creates it. */
export const IDEMPOTENCY_OUTCOMES_TABLE = 'idempotency_outcomes';

/** The states of a recorded outcome. */
export type OutcomeState = 'PROCESSING' | 'SUCCESS' | 'FAILED';

/** The answer recorded for an operation: replayed to every repeat of a SUCCESS. */
export interface RecordedOutcome {
  /** HTTP status of the answer, e.g. 201. */
  statusCode: number;
  /** The answer's body; anything `JSON.stringify` can hold. `undefined`: no body. */
  body?: unknown;
}

/** What identifies an operation: a request id (optional) and the hash of its content. */
export interface OutcomeClaimInput {
  /**
   * Namespace of both keys: the endpoint and whose records these are, e.g.
   * `uploads.xml:user:alice`. Repeats are recognised within one scope only, so records (and
   * recorded answers) of one user are never replayed to another.
   */
  scope: string;
  /** The client's request id, chosen once per operation; `undefined`: none (content hash only). */
  requestId?: string;
  /** Lower-case hex SHA-256 of the raw content. */
  contentHash: string;
  /** Lease of the claim in milliseconds. Default: the recorder's `leaseMs`. */
  leaseMs?: number;
}

/** Which key recognised a repeat. */
export type MatchedBy = 'request_id' | 'content_hash';

/** A claim this caller holds: pass it to `succeed`, `fail` or `succeedWith`, and to `renew` while the work goes on. */
export interface HeldOutcome {
  /** The record's id (a bigint, as text). */
  recordId: string;
  /** The owner token: every write checks it still holds the record. */
  token: string;
  /** 1 for a new record; higher for a take-over. */
  attempt: number;
}

/**
 * What a claim found:
 * - `acquired`: run the operation. `previousState` says what was taken over: `FAILED` (a retry
 *   of a failed operation), `PROCESSING` (a lease that ran out: its owner crashed or is late),
 *   `SUCCESS` (a record past its retention); absent for a new record.
 * - `success`: repeat of a recorded success: answer `outcome` again.
 * - `processing`: another claim holds it; retry after `retryAfterMs`.
 * - `mismatch`: the request id already succeeded with other content.
 */
export type OutcomeClaim =
  | { status: 'acquired'; held: HeldOutcome; previousState?: OutcomeState }
  | { status: 'success'; matchedBy: MatchedBy; recordId: string; outcome: RecordedOutcome }
  | { status: 'processing'; matchedBy: MatchedBy; retryAfterMs: number }
  | { status: 'mismatch' };

/** A record the claim statement found (and did not take over). */
export interface FoundRecord {
  id: string;
  request_id: string | null;
  content_hash: string;
  state: OutcomeState;
  status_code: number | null;
  body: string | null;
  retryable: boolean;
  remaining_ms: number;
}

/** A recorded outcome as stored: status code and JSON text. */
export function outcomeOf(row: Pick<FoundRecord, 'status_code' | 'body'>): RecordedOutcome {
  const outcome: RecordedOutcome = { statusCode: row.status_code ?? 0 };
  if (row.body !== null) outcome.body = JSON.parse(row.body);
  return outcome;
}

function answerFrom(row: FoundRecord, matchedBy: MatchedBy): OutcomeClaim | undefined {
  if (row.retryable) return undefined;
  if (row.state === 'SUCCESS') return { status: 'success', matchedBy, recordId: row.id, outcome: outcomeOf(row) };
  return { status: 'processing', matchedBy, retryAfterMs: Math.max(row.remaining_ms, 0) };
}

/**
 * The answer to a claim that took nothing, from the records it found: the request id's record
 * first, then the content's. `undefined` when the rows do not settle it (a snapshot that missed
 * a concurrent commit): claim again.
 */
export function answerFromFound(rows: readonly FoundRecord[], input: OutcomeClaimInput): OutcomeClaim | undefined {
  const byRequest = input.requestId === undefined ? undefined : rows.find((row) => row.request_id === input.requestId);
  const byContent = rows.find((row) => row.content_hash === input.contentHash);
  if (byRequest) {
    if (byRequest.content_hash === input.contentHash) return answerFrom(byRequest, 'request_id');
    if (!byRequest.retryable) {
      if (byRequest.state === 'SUCCESS') return { status: 'mismatch' };
      return answerFrom(byRequest, 'request_id');
    }
  }
  return byContent ? answerFrom(byContent, 'content_hash') : undefined;
}
