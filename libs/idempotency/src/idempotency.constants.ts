/** Metadata key under which `@NoRepeatSubmit()` stores its route options. */
export const NO_REPEAT_SUBMIT_METADATA = 'idempotency:no-repeat-submit';

/** Metadata key of `@SkipIdempotency()`. */
export const SKIP_IDEMPOTENCY_METADATA = 'idempotency:skip';

/** Header that marks a response replayed from the store (as Stripe does). */
export const REPLAYED_HEADER = 'Idempotent-Replayed';

/** The standard request header of the IETF Idempotency-Key draft. */
export const IDEMPOTENCY_KEY_HEADER = 'idempotency-key';

/** Longest client key accepted, in characters (Stripe's limit). */
export const MAX_KEY_LENGTH = 255;

/** Defaults merged under the user's module options, in one place. */
export const DEFAULTS = Object.freeze({
  keyPrefix: 'no_repeat',
  expireSeconds: 3600,
  leaseSeconds: 10,
  maxHoldSeconds: 300,
  failMode: 'open' as const,
  errorFormat: 'nest' as const,
  required: true,
  anonymous: 'client-key' as const,
  maxResponseBytes: 1_048_576,
  replayHeaders: Object.freeze(['content-type', 'location', 'etag', 'content-location', 'content-disposition', 'cache-control']),
  memoryMaxEntries: 100_000,
  memoryMaxBytes: 67_108_864,
  localCacheMaxEntries: 10_000,
  localCacheMaxBytes: 33_554_432,
  redisCommandTimeoutMs: 1000,
  redisConnectTimeoutMs: 1000,
});
