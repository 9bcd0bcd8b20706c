export {
  createIdempotentClient,
  IDEMPOTENCY_KEY_HEADER,
  REPLAYED_HEADER,
  type HeadersLike,
  type IdempotentClient,
  type IdempotentClientOptions,
  type IdempotentRequestOptions,
  type IdempotentResponse,
} from './idempotent-client.js';
export { IdempotentRequestError } from './idempotent-request.error.js';
export {
  BACKOFF_DEFAULTS,
  IN_PROGRESS_CODE,
  backoffDelayMs,
  isRetryableAnswer,
  parseRetryAfterMs,
  type BackoffOptions,
} from './retry-policy.js';
