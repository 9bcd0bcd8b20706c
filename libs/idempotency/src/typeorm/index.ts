// The TypeORM entry point, `nestjs-idempotency/typeorm`: everything that needs typeorm (an
// optional peer) lives in this folder and is published from here.
// - helpers/: the storage layer (insert-once, conditional transition, consume-once) and its consume log;
// - store/: the PostgreSQL store of the guard's records;
// - outcomes/: the outcome recorder (a request id and a content hash, with a fenced transaction);
// - postgres/: what the store and the recorder share (table names, statements, leases, purges);
// - transactional/: IdempotentTransactions, the claim, the work and its answer in one transaction
//   (on the store's table).
export { uniqueViolationOf, type UniqueViolation } from './helpers/unique-violation.js';
export { insertOnce, type InsertOnceResult } from './helpers/insert-once.js';
export {
  transition,
  type PropertyPath,
  type TransitionRefusal,
  type TransitionResult,
  type TransitionSpec,
} from './helpers/conditional-transition.js';
export { consumeOnce, type ConsumedMessage, type ConsumeOnceResult } from './helpers/consume-once.js';
export { ConsumeLogEntry, IDEMPOTENCY_CONSUME_LOG_TABLE } from './helpers/consume-log.entity.js';
export { IdempotencyConsumeLog1764460800001 } from './helpers/idempotency-consume-log.migration.js';
export { IDEMPOTENCY_ENTITIES, IDEMPOTENCY_HELPER_ENTITIES, IDEMPOTENCY_STORE_ENTITIES } from './entities.js';
export { IDEMPOTENCY_HELPER_MIGRATIONS, IDEMPOTENCY_MIGRATIONS, IDEMPOTENCY_STORE_MIGRATIONS } from './migrations.js';
export { IdempotencyRecords1764460800000 } from './store/idempotency-records.migration.js';
export { IdempotencyResponseFlags1795996800002 } from './store/idempotency-response-flags.migration.js';
export {
  PostgresIdempotencyStore,
  type PostgresIdempotencyStoreOptions,
} from './store/postgres-idempotency.store.js';
export { IdempotencyRecordEntity, IDEMPOTENCY_RECORDS_TABLE } from './store/idempotency-record.entity.js';
export {
  PostgresOutcomeRecorder,
  type OutcomeRecordView,
  type PostgresOutcomeRecorderOptions,
} from './outcomes/postgres-outcome-recorder.js';
export {
  IDEMPOTENCY_OUTCOMES_TABLE,
  type HeldOutcome,
  type MatchedBy,
  type OutcomeClaim,
  type OutcomeClaimInput,
  type OutcomeState,
  type RecordedOutcome,
} from './outcomes/outcome-claim.js';
export { IDEMPOTENCY_OUTCOME_ENTITIES, OutcomeRecordEntity } from './outcomes/outcome-record.entity.js';
export { IDEMPOTENCY_OUTCOME_MIGRATIONS, IdempotencyOutcomes1764547200000 } from './outcomes/idempotency-outcomes.migration.js';
export {
  IdempotentTransactions,
  provideIdempotentTransactions,
  type IdempotentTransactionsOptions,
} from './transactional/idempotent-transactions.js';
export type { IdempotentAnswer, IdempotentRunInput, IdempotentRunResult } from './transactional/idempotent-run.js';
export { answerHttp, type HttpReply } from './transactional/http-answer.js';
