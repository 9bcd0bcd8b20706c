/**
 * The outcome recorder (PostgreSQL, TypeORM DataSource): re-exported by the package's TypeORM
 * entry, since its entity and migration need `typeorm`. `readRequestId` needs no peer and is in
 * the main entry.
 */
export { PostgresOutcomeRecorder, type OutcomeRecordView, type PostgresOutcomeRecorderOptions } from './postgres-outcome-recorder.js';
export {
  IDEMPOTENCY_OUTCOMES_TABLE,
  type HeldOutcome,
  type MatchedBy,
  type OutcomeClaim,
  type OutcomeClaimInput,
  type OutcomeState,
  type RecordedOutcome,
} from './outcome-claim.js';
export { IDEMPOTENCY_OUTCOME_ENTITIES, OutcomeRecordEntity } from './outcome-record.entity.js';
export { IDEMPOTENCY_OUTCOME_MIGRATIONS, IdempotencyOutcomes1764547200000 } from './idempotency-outcomes.migration.js';
