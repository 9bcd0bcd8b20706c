import type { DataSource, EntityManager } from 'typeorm';
import { CONSUMER_COLUMN_CHARS, ConsumeLogEntry, MESSAGE_ID_COLUMN_CHARS } from './consume-log.entity.js';
import { uniqueViolationOf } from './unique-violation.js';
import { IdempotencyError, isBlankText, isUnsafeInteger } from '../../index.js';
import { coverNewConnections } from '../postgres/new-connections.js';
import { pinRepositories, refuseRoutedRepositories } from './routed-repositories.js';
import { DIGEST_BYTES, digestForm } from '../store/record-key.js';

/** A delivered message, named by who consumes it and its id. */
export interface ConsumedMessage {
  /** The consumer (queue and handler); different consumers of one message each process it once. */
  consumer: string;
  /** The message id, stable across redeliveries: any string with a visible character, of any length. */
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
 * - `work` throws: both roll back and the error is rethrown, so a redelivery processes it. So
 *   too when nothing committed without an error reaching consumeOnce (a statement failed and was
 *   caught, PostgreSQL then rolls back at COMMIT): it throws instead of reporting the message
 *   processed, having asked after the commit whether its transaction committed.
 * - Concurrent deliveries: the second waits for the first (in this process, before it takes a
 *   connection; from another, at its log insert); if the first commits, the second is a
 *   duplicate; if it rolls back, the second processes the message.
 *
 * An id of up to 255 characters without NUL is logged as it is; a longer one, or one with a NUL,
 * as its first ~180 bytes, `#sha256:` and the SHA-256 of the whole id (as the PostgreSQL store
 * keeps long keys), so any id fits the column. Only an id written to be the digest form of
 * another would be taken for it.
 *
 * Throws a `RangeError` at the call, before any transaction, for a message without an id (`''`,
 * `undefined`, or white space and invisible characters only: every such message would be taken
 * for the first), for an id that is not
 * well-formed text (a lone surrogate, sent as U+FFFD like every other) and for a consumer name the
 * column cannot hold (over 128 characters, a NUL, a lone surrogate).
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
  const entry = { consumer: checkedConsumer(message.consumer), messageId: loggedMessageId(message.messageId) };
  // Without it TypeORM failed inside the transaction with "this.subQuery is not a function".
  if (!dataSource.hasMetadata(ConsumeLogEntry)) {
    throw new IdempotencyError(
      'consumeOnce: this DataSource has no ConsumeLogEntry entity. Add IDEMPOTENCY_HELPER_ENTITIES (or IDEMPOTENCY_ENTITIES) to its ' +
        'entities (with autoLoadEntities, to a TypeOrmModule.forFeature()), and run IDEMPOTENCY_HELPER_MIGRATIONS.',
    );
  }
  refuseRoutedRepositories(dataSource, 'consumeOnce', 'the message is logged processed');
  // Copies of one message in this process take their turns here, not each on a connection
  // waiting on the first's log row: as many copies as the pool has connections left none for
  // the first's work when it read outside `manager` (an injected repository), and the consumer
  // hung for good (an adversarial helper). Across processes they wait in the database, as before.
  const flights = inFlightOf(dataSource);
  const flight = `${entry.consumer}\0${entry.messageId}`; // a consumer holds no NUL
  const before = flights.get(flight);
  const turn = before ? before.then(ignore, ignore).then(() => consumeLogged(dataSource, entry, work)) : consumeLogged(dataSource, entry, work);
  flights.set(flight, turn);
  try {
    return await turn;
  } finally {
    if (flights.get(flight) === turn) flights.delete(flight);
  }
}

const ignore = () => undefined;

/** Per DataSource, the last delivery in flight of each message (consumer and logged id). */
const inFlight = new WeakMap<DataSource, Map<string, Promise<unknown>>>();

function inFlightOf(dataSource: DataSource): Map<string, Promise<unknown>> {
  let flights = inFlight.get(dataSource);
  if (!flights) inFlight.set(dataSource, (flights = new Map()));
  return flights;
}

async function consumeLogged<R>(dataSource: DataSource, entry: LogKey, work: (manager: EntityManager) => Promise<R>): Promise<ConsumeOnceResult<R>> {
  let processed: { status: 'processed'; result: R };
  let txid: string | undefined;
  coverNewConnections(dataSource);
  try {
    processed = await dataSource.transaction(async (manager) => {
      try {
        txid = await insertLogRow(manager, entry);
      } catch (error) {
        if (uniqueViolationOf(error)) throw new DuplicateDelivery();
        throw error;
      }
      // A unique violation inside `work` is the work's own error, not a duplicate delivery.
      return { status: 'processed' as const, result: await work(pinRepositories(manager)) };
    });
  } catch (error) {
    if (error instanceof DuplicateDelivery) return { status: 'duplicate' };
    throw error;
  }
  await confirmCommitted(dataSource, entry, txid);
  return processed;
}

type LogKey = { consumer: string; messageId: string };

/**
 * Inserts the log row; on PostgreSQL returns the id of the transaction that wrote it
 * (`txid_current()`, 64 bits), whose fate the read-back asks for.
 */
async function insertLogRow(manager: EntityManager, entry: LogKey): Promise<string | undefined> {
  if (manager.connection.driver.options.type !== 'postgres') {
    await manager.insert(ConsumeLogEntry, { ...entry });
    return undefined;
  }
  const inserted = await manager
    .createQueryBuilder()
    .insert()
    .into(ConsumeLogEntry)
    .values({ ...entry })
    .returning('txid_current()::text AS txid')
    .updateEntity(false)
    .execute();
  return String((inserted.raw as Array<{ txid: unknown }>)[0].txid);
}

/**
 * PostgreSQL aborts a transaction at a failed statement, also one caught and gone on from (in
 * `work`, in a `beforeTransactionCommit` subscriber, a statement not awaited), and then answers
 * COMMIT with a rollback and no error; `work` may also have rolled the transaction back itself.
 * (A `work` that commits it and goes on in another is outside the guarantee: the log row has
 * committed with the first, whatever becomes of the rest; see the README.)
 * Reporting `processed` would have the consumer ack a message whose log row never committed.
 * So once the transaction is over, the primary is asked whether the transaction that inserted
 * the log row committed (`txid_status`): not whether some row is there (a concurrent
 * redelivery's may be, as an aborted transaction lets go of its locks at once), nor by the row's
 * own values (an update in a savepoint or by a trigger changes them). One round trip per
 * processed message; elsewhere than on PostgreSQL, the row is looked for. A failure of that read
 * throws too: the redelivery finds the row (a duplicate) or processes the message.
 */
async function confirmCommitted(dataSource: DataSource, entry: LogKey, txid: string | undefined): Promise<void> {
  const runner = dataSource.createQueryRunner('master');
  let committed: boolean;
  try {
    if (txid === undefined) {
      committed = await runner.manager.existsBy(ConsumeLogEntry, { consumer: entry.consumer, messageId: entry.messageId });
    } else {
      const [row] = (await runner.query('SELECT txid_status($1::bigint) AS status', [txid])) as Array<{ status: string | null }>;
      committed = row?.status === 'committed';
    }
  } catch (error) {
    throw new IdempotencyError('consumeOnce: could not confirm that the transaction committed; the message is not reported processed.', {
      cause: error,
    });
  } finally {
    await runner.release();
  }
  if (!committed) {
    throw new IdempotencyError(
      'consumeOnce: the transaction did not commit (a statement failed inside it and was caught: in `work`, in a subscriber, ' +
        'or not awaited; or `work` rolled it back); the message is not logged as processed. Let the error reach consumeOnce, ' +
        'or run the statement in a savepoint.',
    );
  }
}

/** The consumer is the developer's constant: a name the column cannot hold is a mistake to say at once. */
function checkedConsumer(consumer: unknown): string {
  if (typeof consumer === 'string' && !isBlankText(consumer) && !/[\0\p{Cs}]/u.test(consumer) && fits(consumer, CONSUMER_COLUMN_CHARS)) return consumer;
  const shown = typeof consumer === 'string' ? `${JSON.stringify(consumer.slice(0, 40))}, ${consumer.length} long` : String(consumer);
  throw new RangeError(`consumeOnce: \`consumer\` must be a name of 1 to ${CONSUMER_COLUMN_CHARS} characters, not only spaces or invisible characters, without NUL or a lone surrogate (got ${shown})`);
}

/** The `message_id` column's value for a message id: the id itself where it fits, as before. */
function loggedMessageId(messageId: unknown): string {
  // A number was logged as its text (as the driver sends it); keep that so its rows still match.
  // NaN and the infinities are no ids (a failed parse): every such message would be the first's
  // duplicate; nor an integer past 2^53, which a JSON parse rounds: ids 37 apart fell together,
  // and 6 of 8 messages were acked as duplicates unrun (an adversarial helper).
  const nonFinite = typeof messageId === 'number' && (!Number.isFinite(messageId) || isUnsafeInteger(messageId));
  const id = !nonFinite && (typeof messageId === 'number' || typeof messageId === 'bigint') ? String(messageId) : messageId;
  // An id of white space or invisible characters only is as much none: a field left blank.
  if (typeof id !== 'string' || isBlankText(id)) {
    throw new RangeError(
      `consumeOnce: the message has no id (\`messageId\` is ${typeof id === 'number' ? id : (JSON.stringify(id) ?? String(id))}: an id is a ` +
        'non-empty string or a finite number, an integer only within ±2^53, past which a JSON parse rounds it: send such ids as strings); every message without one would be taken for the first and dropped as its duplicate. ' +
        'Pass an id stable across redeliveries.',
    );
  }
  // The driver sends text as UTF-8, where every lone surrogate is U+FFFD: two such ids would be one.
  if (/\p{Cs}/u.test(id)) {
    throw new RangeError(`consumeOnce: the message id ${JSON.stringify(id.slice(0, 40))} is not well-formed text (a lone surrogate)`);
  }
  if (!id.includes('\0') && fits(id, MESSAGE_ID_COLUMN_CHARS)) return id;
  return digestForm(id, MESSAGE_ID_COLUMN_CHARS - DIGEST_BYTES);
}

/** Whether `text` has at most `chars` characters as PostgreSQL counts them (code points). */
function fits(text: string, chars: number): boolean {
  if (text.length <= chars) return true;
  let count = 0;
  for (const _ of text) if (++count > chars) return false;
  return true;
}
