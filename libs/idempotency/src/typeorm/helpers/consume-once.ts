import type { DataSource, EntityManager } from 'typeorm';
import { ConsumeLogEntry } from './consume-log.entity.js';
import { uniqueViolationOf } from './unique-violation.js';

/** A delivered message, named by who consumes it and its id. */
export interface ConsumedMessage {
  /** The consumer (queue and handler); different consumers of one message each process it once. */
  consumer: string;
  /** The message id, stable across redeliveries. */
  messageId: string;
}

/** What `consumeOnce` did with a delivery. */
export type ConsumeOnceResult<R> = { status: 'processed'; result: R } | { status: 'duplicate' };

/** Thrown inside the transaction to roll it back when the log says the message was processed. */
class DuplicateDelivery extends Error {}

/**
 * Processes a message at most once per consumer, and exactly once with redelivery: ONE
 * transaction inserts the `(consumer, messageId)` row into `idempotency_consume_log` and runs
 * `work` with the same `EntityManager`, so the log row and the work's changes commit together
 * or not at all.
 *
 * - Already processed: the log insert hits the primary key, the transaction rolls back and
 *   `work` does not run: `{ status: 'duplicate' }`.
 * - `work` throws: both roll back and the error is rethrown, so a redelivery processes it.
 * - Concurrent deliveries: the second log insert waits for the first transaction; if that
 *   commits, the second is a duplicate; if it rolls back, the second processes the message.
 *
 * Needs `ConsumeLogEntry` in the DataSource's entities (`IDEMPOTENCY_ENTITIES`) and the table
 * (`IDEMPOTENCY_MIGRATIONS`). Runs at the DataSource's isolation level; under SERIALIZABLE a
 * concurrent duplicate may fail with a serialization error instead (retry it).
 */
export async function consumeOnce<R>(
  dataSource: DataSource,
  message: ConsumedMessage,
  work: (manager: EntityManager) => Promise<R>,
): Promise<ConsumeOnceResult<R>> {
  try {
    return await dataSource.transaction(async (manager) => {
      try {
        await manager.insert(ConsumeLogEntry, { consumer: message.consumer, messageId: message.messageId });
      } catch (error) {
        if (uniqueViolationOf(error)) throw new DuplicateDelivery();
        throw error;
      }
      // A unique violation inside `work` is the work's own error, not a duplicate delivery.
      return { status: 'processed' as const, result: await work(manager) };
    });
  } catch (error) {
    if (error instanceof DuplicateDelivery) return { status: 'duplicate' };
    throw error;
  }
}
