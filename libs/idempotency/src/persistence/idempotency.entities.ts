import { IdempotencyRecordEntity } from '../stores/postgres/idempotency-record.entity.js';
import { ConsumeLogEntry } from './consume-log.entity.js';

/** The library's entities: add them to the DataSource's `entities` (`consumeOnce` needs them). */
export const IDEMPOTENCY_ENTITIES = [IdempotencyRecordEntity, ConsumeLogEntry];
