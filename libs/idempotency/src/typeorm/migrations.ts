import { IdempotencyConsumeLog1764460800001 } from './helpers/idempotency-consume-log.migration.js';
import { IdempotencyRecords1764460800000 } from './store/idempotency-records.migration.js';
import { IdempotencyResponseFlags1795996800002 } from './store/idempotency-response-flags.migration.js';

/** The storage helpers' migrations (the consume log), without the store's table. */
export const IDEMPOTENCY_HELPER_MIGRATIONS = [IdempotencyConsumeLog1764460800001];

/** The migrations of `PostgresIdempotencyStore`'s table, oldest first. */
export const IDEMPOTENCY_STORE_MIGRATIONS = [IdempotencyRecords1764460800000, IdempotencyResponseFlags1795996800002];

/**
 * The store's and the helpers' migrations (PostgreSQL), oldest first: add them to the
 * DataSource's `migrations`, e.g. `migrations: [...IDEMPOTENCY_MIGRATIONS, ...yours]`.
 */
export const IDEMPOTENCY_MIGRATIONS = [
  IdempotencyRecords1764460800000,
  IdempotencyConsumeLog1764460800001,
  IdempotencyResponseFlags1795996800002,
];
