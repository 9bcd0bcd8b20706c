import { ConsumeLogEntry } from './helpers/consume-log.entity.js';
import { IdempotencyRecordEntity } from './store/idempotency-record.entity.js';

/** The storage helpers' entities (`consumeOnce` needs `ConsumeLogEntry`), without the store's table. */
export const IDEMPOTENCY_HELPER_ENTITIES = [ConsumeLogEntry];

/** The entity of `PostgresIdempotencyStore`'s table (for tooling and `synchronize`; the store speaks SQL). */
export const IDEMPOTENCY_STORE_ENTITIES = [IdempotencyRecordEntity];

/** The store's and the helpers' entities: add them to the DataSource's `entities`. */
export const IDEMPOTENCY_ENTITIES = [...IDEMPOTENCY_STORE_ENTITIES, ...IDEMPOTENCY_HELPER_ENTITIES];
