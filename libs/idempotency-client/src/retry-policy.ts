/** The guard's code for "a request with this key is still being processed" (a 409). */
export const IN_PROGRESS_CODE = 'IDEMPOTENCY_IN_PROGRESS';
const USER_UNRESOLVED_CODE = 'IDEMPOTENCY_USER_UNRESOLVED';

/** Delays between attempts. */
export interface BackoffOptions {
  /** Delay before the first retry, in milliseconds, before jitter; doubles on each retry. Default 100. */
  baseMs?: number;
  /** Largest delay, in milliseconds, before jitter. Default 5000. */
  maxMs?: number;
  /**
   * Share of each delay that is random, from 0 (none: exactly the exponential delay) to 1 (full
   * jitter: anywhere between 0 and it). Default 0.5. Spreads the retries of many clients.
   */
  jitter?: number;
}

export const BACKOFF_DEFAULTS = Object.freeze({ baseMs: 100, maxMs: 5000, jitter: 0.5 });

/**
 * The delay before retry number `retry` (1 for the first retry), in milliseconds:
 * `min(maxMs, baseMs * 2^(retry-1))`, of which the `jitter` share is random.
 */
export function backoffDelayMs(retry: number, backoff: Required<BackoffOptions>, random: () => number = Math.random): number {
  const exponential = Math.min(backoff.maxMs, backoff.baseMs * 2 ** Math.max(0, retry - 1));
  const jitter = Math.min(1, Math.max(0, backoff.jitter));
  return Math.round(exponential * (1 - jitter * random()));
}

/**
 * `Retry-After` in milliseconds: delay-seconds (`"2"`) or an HTTP date. Undefined when the header
 * is absent or unreadable; a date in the past is 0.
 */
export function parseRetryAfterMs(value: string | null, now: number = Date.now()): number | undefined {
  if (value === null) return undefined;
  const trimmed = value.trim();
  if (/^\d+$/.test(trimmed)) return Number(trimmed) * 1000;
  // HTTP dates start with the day name; V8's lenient Date.parse would read "-1" as a year.
  const date = /^[a-z]{3}/i.test(trimmed) ? Date.parse(trimmed) : NaN;
  return Number.isNaN(date) ? undefined : Math.max(0, date - now);
}

/**
 * Whether an answer is worth another attempt with the same key:
 * - 408: the server (an outer timeout, a proxy) gave up waiting, and the handler may run on
 *   behind it; the retry gets 409 in progress, then its outcome: the replay (a proxy's 408),
 *   409 `IDEMPOTENCY_RESPONSE_NOT_REPLAYABLE` (the app's own timeout answered, so no answer was
 *   kept: it ran), or a run (it failed);
 * - 5xx: the server failed; the retry runs again (the handler failed, so the key was released) or
 *   gets the first answer (a 409 `IDEMPOTENCY_RESPONSE_NOT_REPLAYABLE` when that was the 5xx).
 *   Not a 500 `IDEMPOTENCY_USER_UNRESOLVED`: the server cannot tell its callers apart (its
 *   configuration), the same on every attempt, and nothing ran;
 * - 409 with `Retry-After` or the code `IDEMPOTENCY_IN_PROGRESS`: the first attempt is still
 *   running; the retry gets its replay once it completes. A 409 without either is final: a
 *   business conflict (e.g. the demo's `ORDER_EXISTS`), or `IDEMPOTENCY_RESPONSE_NOT_REPLAYABLE`
 *   (the operation completed but its answer was not kept: read the resource instead).
 * Every other answer is final: 2xx, 400 (missing or invalid key, invalid payload: fix the
 * request), 422 (the key was used with another payload: a new operation needs a new key), and
 * the other 4xx.
 */
export function isRetryableAnswer(status: number, retryAfter: string | null, body: unknown): boolean {
  const code = typeof body === 'object' && body !== null ? (body as { code?: unknown }).code : undefined;
  if (status >= 500 && status <= 599) return code !== USER_UNRESOLVED_CODE;
  if (status === 408) return true;
  if (status !== 409) return false;
  return retryAfter !== null || code === IN_PROGRESS_CODE;
}
