// The TypeORM entry point, `nestjs-idempotency/typeorm`: the storage layer (insert-once,
// conditional transition, consume-once), the PostgreSQL store and outcome recorder, their
// entities and migrations. Separate from the main entry: it needs typeorm, an optional peer.
export { uniqueViolationOf, type UniqueViolation } from './persistence/unique-violation.js';
export { insertOnce, type InsertOnceResult } from './persistence/insert-once.js';
export {
  transition,
  type TransitionRefusal,
  type TransitionResult,
  type TransitionSpec,
} from './persistence/conditional-transition.js';
export { consumeOnce, type ConsumedMessage, type ConsumeOnceResult } from './persistence/consume-once.js';
export { ConsumeLogEntry, IDEMPOTENCY_CONSUME_LOG_TABLE } from './persistence/consume-log.entity.js';
export { IDEMPOTENCY_ENTITIES } from './persistence/idempotency.entities.js';
export { IDEMPOTENCY_MIGRATIONS } from './persistence/migrations/idempotency.migrations.js';
export { IdempotencyRecords1764460800000 } from './persistence/migrations/idempotency-records.migration.js';
export { IdempotencyConsumeLog1764460800001 } from './persistence/migrations/idempotency-consume-log.migration.js';
export { IdempotencyResponseFlags1795996800002 } from './persistence/migrations/idempotency-response-flags.migration.js';
export {
  PostgresIdempotencyStore,
  type PostgresIdempotencyStoreOptions,
} from './stores/postgres/postgres-idempotency.store.js';
export { IdempotencyRecordEntity, IDEMPOTENCY_RECORDS_TABLE } from './stores/postgres/idempotency-record.entity.js';
export * from './outcomes/index.js';
