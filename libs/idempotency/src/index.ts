export { IdempotencyModule } from './idempotency.module.js';
export {
  IDEMPOTENCY_MODULE_OPTIONS,
  InjectIdempotencyStore,
  type IdempotencyModuleExtras,
  type IdempotencyOptionsFactory,
} from './idempotency.module-definition.js';
export type {
  AnonymousPolicy,
  FailMode,
  IdempotencyModuleOptions,
  IdempotencyUserId,
  KeyResolver,
  NoRepeatSubmitOptions,
  SaveStatuses,
} from './idempotency.options.js';
export { NoRepeatSubmit, SkipIdempotency } from './decorators/no-repeat-submit.decorator.js';
export { LeaseSignal } from './decorators/lease-signal.decorator.js';
export { settleRmqMessage, type SkippedMessage, type SkippedMessageHandler, type SkippedMessageReason } from './messages/skipped-message.js';
export { UNSAFE_METHODS } from './decorators/no-repeat-submit.metadata.js';
export { IdempotencyInterceptor } from './interceptors/idempotency.interceptor.js';
export {
  IdempotencyCounters,
  type IdempotencyMetricsSink,
  type IdempotencyOutcome,
} from './metrics/idempotency-counters.js';
export type { PrometheusMetricsOptions } from './metrics/prometheus-metrics.js';
export { IdempotencyEvents } from './events/idempotency-events.js';
export type {
  IdempotencyAcquiredEvent,
  IdempotencyCompletedEvent,
  IdempotencyEvent,
  IdempotencyEventBase,
  IdempotencyEventListener,
  IdempotencyEventType,
  IdempotencyFailOpenEvent,
  IdempotencyInProgressEvent,
  IdempotencyKeyReusedEvent,
  IdempotencyLeaseLostEvent,
  IdempotencyLeaseTakeoverEvent,
  IdempotencyReleasedEvent,
  IdempotencyRenewedEvent,
  IdempotencyReplayedEvent,
  IdempotencyShuttingDownEvent,
  IdempotencyStoreCallEvent,
  IdempotencyStoreErrorEvent,
  IdempotencyTransport,
} from './events/idempotency-event.js';
export type { GuardedRoute } from './interceptors/route-options.js';
export {
  IdempotencyStore,
  type ClaimInput,
  type ClaimResult,
  type ForgetResult,
  type SavedResponse,
  type StoredRecord,
  type UnreplayableReason,
} from './stores/idempotency-store.js';
export { MemoryIdempotencyStore, type MemoryIdempotencyStoreOptions } from './stores/memory/memory-idempotency.store.js';
export { RedisIdempotencyStore, type RedisIdempotencyStoreOptions } from './stores/redis/redis-idempotency.store.js';
export { LocalCacheIdempotencyStore } from './stores/local-cache/local-cache.store.js';
export type { LocalCacheOptions } from './stores/local-cache/local-cache-options.js';
export { REDIS_CLIENT_DEFAULTS } from './stores/create-store.js';
export {
  IdempotencyConfigError,
  IdempotencyError,
  IdempotencyKeyError,
  IdempotencyNotARecordError,
  IdempotencyStoreError,
} from './errors/idempotency.errors.js';
export { IdempotencyErrorCode, IdempotencyHttpException, IdempotencyRefusals } from './errors/idempotency-http.exceptions.js';
export {
  PROBLEM_JSON_CONTENT_TYPE,
  PROBLEM_TYPE_PREFIX,
  type ErrorFormat,
  type ProblemDetails,
} from './errors/problem-details.js';
export { isBlankText, isUnsafeInteger, parseKeyHeader, readKeyHeader, type ParsedKeyHeader } from './keys/idempotency-key.js';
export type { RequestHeaders } from './keys/header-lines.js';
/** The module's options with every default filled in (DI token), for a provider of the app's that needs them (the health indicator's probe key). */
export { IDEMPOTENCY_RESOLVED_OPTIONS, type ResolvedIdempotencyOptions } from './idempotency.config.js';
export {
  DEFAULTS as IDEMPOTENCY_DEFAULTS,
  IDEMPOTENCY_KEY_HEADER,
  MAX_KEY_LENGTH,
  NO_REPEAT_SUBMIT_METADATA,
  REPLAYED_HEADER,
} from './idempotency.constants.js';
export { fingerprintRequest, type FingerprintFile, type FingerprintInput } from './keys/fingerprint.js';
export { buildStorageKey, type KeyUser } from './keys/storage-key.js';
export {
  IdempotencyAdmin,
  type IdempotencyForgetResult,
  type IdempotencyInspection,
  type IdempotencyRecordRef,
  type IdempotencyRecordUser,
} from './admin/idempotency-admin.service.js';
export { ContentDigest, ContentHash } from './content-digest/content-digest.decorator.js';
export {
  CONTENT_DIGEST_METADATA,
  ContentDigestGuard,
  type ContentDigestOptions,
  type ContentHashedRequest,
} from './content-digest/content-digest.guard.js';
export {
  CONTENT_DIGEST_HEADER,
  CONTENT_HASH_HEADER,
  parseContentDigestHeader,
  parseContentHashHeader,
  parseIfMatchDigest,
  readClientDigests,
  sha256Hex,
  type ClientDigest,
  type ClientDigests,
  type DigestSource,
} from './content-digest/content-digest.js';
export { ContentHashErrorCode, ContentHashHttpException } from './content-digest/content-digest.exceptions.js';
export { readRequestId, REQUEST_ID_HEADERS, type RequestIdHeader } from './keys/request-id.js';
