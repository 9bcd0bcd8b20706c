import { IdempotencyConsumeLog1764460800001 } from './idempotency-consume-log.migration.js';
import { IdempotencyRecords1764460800000 } from './idempotency-records.migration.js';
import { IdempotencyResponseFlags1795996800002 } from './idempotency-response-flags.migration.js';

/**
 * The library's migrations (PostgreSQL), oldest first: add them to the DataSource's
 * `migrations`, e.g. `migrations: [...IDEMPOTENCY_MIGRATIONS, ...yours]`.
 */
export const IDEMPOTENCY_MIGRATIONS = [
  IdempotencyRecords1764460800000,
  IdempotencyConsumeLog1764460800001,
  IdempotencyResponseFlags1795996800002,
];
