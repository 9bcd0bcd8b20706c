import { afterAll, beforeAll, describe, expect, it } from '@jest/globals';
import type { Pool } from 'pg';
import { randomUUID } from 'node:crypto';
import {
  Column,
  DataSource,
  Entity,
  EventSubscriber,
  Like,
  PrimaryGeneratedColumn,
  type EntityManager,
  type EntitySubscriberInterface,
  type TransactionCommitEvent,
} from 'typeorm';
import { ConsumeLogEntry } from './consume-log.entity.js';
import { consumeOnce } from './consume-once.js';
import { IdempotencyError } from '../../index.js';
import { dropSchemaDataSource, openSchemaDataSource, testSchemaName } from '../../../../../test/support/test-schema.js';

/** The consumer's business effect; deliberately without a unique key, so every run shows. */
@Entity({ name: 'ledger_lines' })
class LedgerLine {
  @PrimaryGeneratedColumn()
  id!: number;

  @Column({ name: 'message_id', type: 'text' })
  messageId!: string;

  @Column({ type: 'varchar', length: 128 })
  consumer!: string;
}

/** Query runners whose commit a subscriber spoils: a failing write it catches (an outbox flush). */
const failBeforeCommit = new WeakSet<object>();

@EventSubscriber()
class OutboxFlush implements EntitySubscriberInterface {
  async beforeTransactionCommit(event: TransactionCommitEvent): Promise<void> {
    if (!failBeforeCommit.has(event.queryRunner)) return;
    await event.queryRunner.query('SELECT no_such_column FROM ledger_lines').catch(() => undefined);
  }
}

describe('consumeOnce (PostgreSQL)', () => {
  const schema = testSchemaName();
  let dataSource: DataSource;
  const lines = (messageId: string) => dataSource.getRepository(LedgerLine).countBy({ messageId });
  const logged = (messageId: string) => dataSource.getRepository(ConsumeLogEntry).countBy({ messageId });
  const book = (consumer: string, messageId: string) => async (manager: EntityManager) =>
    (await manager.insert(LedgerLine, { consumer, messageId })).identifiers[0].id as number;

  beforeAll(async () => {
    dataSource = await openSchemaDataSource(schema, {
      entities: [ConsumeLogEntry, LedgerLine],
      subscribers: [OutboxFlush],
      extra: { max: 30 },
      synchronize: true,
    });
  });
  afterAll(async () => {
    await dropSchemaDataSource(dataSource);
  });

  it('processes a message once and reports the redelivery as a duplicate without running the work', async () => {
    const message = { consumer: 'billing', messageId: 'm-once' };
    const first = await consumeOnce(dataSource, message, book('billing', 'm-once'));
    expect(first).toEqual({ status: 'processed', result: expect.any(Number) });
    let ran = false;
    const again = await consumeOnce(dataSource, message, async () => {
      ran = true;
    });
    expect(again).toEqual({ status: 'duplicate' });
    expect(ran).toBe(false);
    expect(await lines('m-once')).toBe(1);
  });

  // Four processes (a DataSource each) and this one, four deliveries each: in a process they take
  // their turns; between processes they queue on the log row in the database.
  it('runs the work once for 20 concurrent deliveries of one message, across five processes', async () => {
    const message = { consumer: 'billing', messageId: 'm-race' };
    const others = await Promise.all(Array.from({ length: 4 }, () => new DataSource({ ...dataSource.options, subscribers: [] }).initialize()));
    const waits = new Set<number>();
    const sources = [dataSource, ...others];
    let results: Awaited<ReturnType<typeof consumeOnce<number>>>[];
    try {
      results = await Promise.all(
        Array.from({ length: 20 }, (_, i) =>
          consumeOnce(sources[i % 5], message, async (manager) => {
            const id = await book('billing', 'm-race')(manager);
            // Hold the transaction open, so the other processes' deliveries queue on the log row.
            await manager.query('SELECT pg_sleep(0.05)');
            return id;
          }),
        ),
      );
      for (const source of sources) waits.add((source.driver as unknown as { master: Pool }).master.totalCount);
    } finally {
      await Promise.all(others.map((other) => other.destroy()));
    }
    // Each process opened a connection of its own for the message (they ran side by side).
    expect([...waits].every((count) => count >= 1)).toBe(true);
    expect(results.filter((r) => r.status === 'processed')).toHaveLength(1);
    expect(results.filter((r) => r.status === 'duplicate')).toHaveLength(19);
    expect(await lines('m-race')).toBe(1);
    expect(await logged('m-race')).toBe(1);
  });

  it('rolls back the log row with a failing work, so the redelivery processes the message', async () => {
    const message = { consumer: 'billing', messageId: 'm-fail' };
    const failure = new Error('downstream refused');
    await expect(
      consumeOnce(dataSource, message, async (manager) => {
        await book('billing', 'm-fail')(manager);
        throw failure;
      }),
    ).rejects.toBe(failure);
    expect(await lines('m-fail')).toBe(0);
    expect(await logged('m-fail')).toBe(0);

    expect(await consumeOnce(dataSource, message, book('billing', 'm-fail'))).toMatchObject({ status: 'processed' });
    expect(await lines('m-fail')).toBe(1);
  });

  // PostgreSQL aborts a transaction at a failed statement, even one the work caught, and then
  // answers COMMIT with a rollback and no error: "processed" had the consumer ack a message
  // nothing of which was committed (found by an adversarial helper: the message was lost).
  it('throws when the work caught a failed statement (the transaction was aborted), so the redelivery processes it', async () => {
    const message = { consumer: 'billing', messageId: 'm-swallow' };
    await expect(
      consumeOnce(dataSource, message, async (manager) => {
        await book('billing', 'm-swallow')(manager);
        await manager.query('SELECT no_such_column FROM ledger_lines').catch(() => undefined);
        return 'ok';
      }),
    ).rejects.toThrow(/did not commit/);
    expect(await lines('m-swallow')).toBe(0);
    expect(await logged('m-swallow')).toBe(0);

    expect(await consumeOnce(dataSource, message, book('billing', 'm-swallow'))).toMatchObject({ status: 'processed' });
    expect(await lines('m-swallow')).toBe(1);
  });

  // Round 3 of the adversaries: the same silent rollback from a failure after the work returned,
  // which a check before the commit cannot see.
  it.each([
    ['a beforeTransactionCommit subscriber caught a failed write', async (manager: EntityManager) => {
      failBeforeCommit.add(manager.queryRunner!);
    }],
    ['a save not awaited failed after the work returned', async (manager: EntityManager) => {
      void manager.query('SELECT no_such_column FROM ledger_lines').catch(() => undefined);
    }],
    ['the work rolled the transaction back itself', async (manager: EntityManager) => {
      await manager.query('ROLLBACK');
    }],
  ])('throws when nothing committed: %s', async (_case, spoil) => {
    const messageId = `m-spoiled-${randomUUID()}`;
    const message = { consumer: 'billing', messageId };
    await expect(
      consumeOnce(dataSource, message, async (manager) => {
        await book('billing', messageId)(manager);
        await spoil(manager);
        return 'ok';
      }),
    ).rejects.toThrow(/did not commit/);
    expect([await lines(messageId), await logged(messageId)]).toEqual([0, 0]);
    expect(await consumeOnce(dataSource, message, book('billing', messageId))).toMatchObject({ status: 'processed' });
  });

  // Round 4 of the adversaries: the aborted transaction let go of the log row's lock at once, a
  // redelivery committed its own row meanwhile, and the first delivery's read-back found that
  // row: both reported processed, with only the second's effect committed.
  it("throws for an aborted delivery even when a concurrent redelivery committed the message's log row first", async () => {
    const messageId = `m-raced-${randomUUID()}`;
    const message = { consumer: 'billing', messageId };
    const sleep = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms));
    // The redelivery starts once the first delivery's work runs: its log row is inserted and locked.
    let working!: () => void;
    const started = new Promise<void>((resolve) => (working = resolve));
    const aborted = consumeOnce(dataSource, message, async (manager) => {
      working();
      await manager.insert(LedgerLine, { consumer: 'A', messageId });
      await manager.query('SELECT no_such_column FROM ledger_lines').catch(() => undefined);
      await sleep(300);
      return 'A';
    });
    await started;
    // From another process (in this one, copies of a message take their turns).
    const elsewhere = await new DataSource({ ...dataSource.options, subscribers: [] }).initialize();
    const redelivered = consumeOnce(elsewhere, message, async (manager) => {
      await manager.insert(LedgerLine, { consumer: 'B', messageId });
      await sleep(100);
      return 'B';
    });
    const [a, b] = await Promise.allSettled([aborted, redelivered]);
    await elsewhere.destroy();
    expect(a.status === 'rejected' && String(a.reason)).toMatch(/did not commit/);
    expect(b).toEqual({ status: 'fulfilled', value: { status: 'processed', result: 'B' } });
    const consumers = (await dataSource.getRepository(LedgerLine).findBy({ messageId })).map((line) => line.consumer);
    expect(consumers).toEqual(['B']);
  });

  // Round 5 of the adversaries: a read-back by the row's xmin said "did not commit" for a row
  // updated in a savepoint (its xmin is the subtransaction's): both had committed.
  it('reports processed when the work touched its log row in a savepoint', async () => {
    const messageId = `m-savepoint-${randomUUID()}`;
    const result = await consumeOnce(dataSource, { consumer: 'billing', messageId }, async (manager) => {
      await book('billing', messageId)(manager);
      await manager.transaction((inner) => inner.getRepository(ConsumeLogEntry).update({ consumer: 'billing', messageId }, { consumedAt: () => 'now()' }));
      return 'ok';
    });
    expect(result).toEqual({ status: 'processed', result: 'ok' });
    expect([await lines(messageId), await logged(messageId)]).toEqual([1, 1]);
  });

  // Round 6 of the adversaries, against a read-back by the row's consumed_at as text: a session
  // time zone set by the work, and a trigger updating consumed_at, read as "did not commit".
  it('reports processed whatever the work does to its session settings or a trigger to the log row', async () => {
    const zoned = `m-zone-${randomUUID()}`;
    expect(
      await consumeOnce(dataSource, { consumer: 'billing', messageId: zoned }, async (manager) => {
        await book('billing', zoned)(manager);
        await manager.query("SET TIME ZONE 'Asia/Kolkata'");
        await manager.query("SET DateStyle = 'SQL, DMY'");
        return 'ok';
      }),
    ).toEqual({ status: 'processed', result: 'ok' });
    const table = `"${schema}".idempotency_consume_log`;
    await dataSource.query(
      `CREATE FUNCTION "${schema}".restamp() RETURNS trigger LANGUAGE plpgsql AS $$ BEGIN ` +
        `UPDATE ${table} SET consumed_at = clock_timestamp() WHERE consumer = NEW.consumer AND message_id = NEW.message_id; RETURN NULL; END $$`,
    );
    await dataSource.query(`CREATE TRIGGER restamp AFTER INSERT ON ${table} FOR EACH ROW EXECUTE FUNCTION "${schema}".restamp()`);
    try {
      const restamped = `m-trigger-${randomUUID()}`;
      expect(await consumeOnce(dataSource, { consumer: 'billing', messageId: restamped }, book('billing', restamped))).toMatchObject({
        status: 'processed',
      });
    } finally {
      await dataSource.query(`DROP TRIGGER restamp ON ${table}`);
    }
  });

  it.each([
    ['another process: its log insert waits for the row', true],
    ['this process: it waits its turn', false],
  ])('lets a delivery waiting on a first one that rolls back process the message (%s)', async (_where, elsewhere) => {
    const messageId = `m-wait-${randomUUID()}`;
    const message = { consumer: 'billing', messageId };
    let logRowHeld!: () => void;
    const held = new Promise<void>((resolve) => (logRowHeld = resolve));
    const first = consumeOnce(dataSource, message, async (manager) => {
      logRowHeld();
      await manager.query('SELECT pg_sleep(0.2)');
      throw new Error('first delivery fails');
    });
    await held;
    const other = elsewhere ? await new DataSource({ ...dataSource.options, subscribers: [] }).initialize() : dataSource;
    try {
      // Starts while the first transaction holds the uncommitted log row.
      const second = consumeOnce(other, message, book('billing', messageId));
      await expect(first).rejects.toThrow('first delivery fails');
      expect(await second).toMatchObject({ status: 'processed' });
    } finally {
      if (other !== dataSource) await other.destroy();
    }
    expect(await lines(messageId)).toBe(1);
  });

  it('lets different consumers of one message each process it', async () => {
    const [billing, shipping] = await Promise.all([
      consumeOnce(dataSource, { consumer: 'billing', messageId: 'm-shared' }, book('billing', 'm-shared')),
      consumeOnce(dataSource, { consumer: 'shipping', messageId: 'm-shared' }, book('shipping', 'm-shared')),
    ]);
    expect(billing.status).toBe('processed');
    expect(shipping.status).toBe('processed');
    expect(await lines('m-shared')).toBe(2);
  });

  it('rethrows a unique violation raised by the work itself instead of calling it a duplicate', async () => {
    const error = await consumeOnce(dataSource, { consumer: 'billing', messageId: 'm-own' }, async (manager) => {
      await manager.insert(ConsumeLogEntry, { consumer: 'other', messageId: 'x' });
      await manager.insert(ConsumeLogEntry, { consumer: 'other', messageId: 'x' });
    }).catch((e: unknown) => e);
    expect(error).toBeInstanceOf(Error);
    expect((error as { driverError?: { code?: string } }).driverError?.code).toBe('23505');
    expect(await logged('m-own')).toBe(0);
  });

  it("takes an id of any length: up to the column's 255 characters as it is, longer as a head and its SHA-256", async () => {
    // A row logged before long ids were handled: an id at the column's width, in characters.
    const atWidth = '\u{1F600}'.repeat(255);
    await dataSource.getRepository(ConsumeLogEntry).insert({ consumer: 'billing', messageId: atWidth });
    expect(await consumeOnce(dataSource, { consumer: 'billing', messageId: atWidth }, book('billing', 'w'))).toEqual({ status: 'duplicate' });

    const long = 'm-long-'.padEnd(300, 'x');
    const longer = `${'\u{1F600}'.repeat(1000)}a`;
    const sibling = `${'\u{1F600}'.repeat(1000)}b`;
    for (const messageId of [long, longer, sibling]) {
      expect(await consumeOnce(dataSource, { consumer: 'billing', messageId }, book('billing', messageId))).toMatchObject({ status: 'processed' });
      expect(await consumeOnce(dataSource, { consumer: 'billing', messageId }, book('billing', messageId))).toEqual({ status: 'duplicate' });
      expect(await lines(messageId)).toBe(1);
    }
    const stored = await dataSource.getRepository(ConsumeLogEntry).findOneByOrFail({ consumer: 'billing', messageId: Like('m-long-%') });
    expect(stored.messageId).toMatch(/^m-long-x+#sha256:[0-9a-f]{64}$/);
    expect(stored.messageId.length).toBeLessThanOrEqual(255);
  });

  it('takes an id holding a NUL, which PostgreSQL text cannot hold, and keeps it apart from the same id without', async () => {
    for (const messageId of ['m-nul\u0000a', 'm-nul\u0000b', 'm-nul']) {
      expect(await consumeOnce(dataSource, { consumer: 'billing', messageId }, book('billing', messageId.replace('\u0000', '0')))).toMatchObject({
        status: 'processed',
      });
      expect(await consumeOnce(dataSource, { consumer: 'billing', messageId }, async () => undefined)).toEqual({ status: 'duplicate' });
    }
  });

  // An adversarial helper (session 20): with autoLoadEntities and no forFeature of the log, the
  // call failed inside the transaction with TypeORM's "this.subQuery is not a function".
  it('names the missing log entity when the DataSource lacks it, before any transaction', async () => {
    const bare = await openSchemaDataSource(testSchemaName(), { entities: [LedgerLine], synchronize: true });
    try {
      let ran = false;
      const error = await consumeOnce(bare, { consumer: 'c', messageId: 'm-bare' }, async () => {
        ran = true;
      }).catch((e: unknown) => e);
      expect(error).toBeInstanceOf(IdempotencyError);
      expect((error as Error).message).toMatch(/no ConsumeLogEntry entity\. Add IDEMPOTENCY_HELPER_ENTITIES/);
      expect(ran).toBe(false);
    } finally {
      await dropSchemaDataSource(bare);
    }
  });

  it('refuses a consumer name longer than the column at the call, before any transaction', async () => {
    let ran = false;
    const error = await consumeOnce(dataSource, { consumer: 'c'.repeat(129), messageId: 'm-c' }, async () => {
      ran = true;
    }).catch((e: unknown) => e);
    expect(error).toBeInstanceOf(RangeError);
    expect((error as Error).message).toMatch(/consumer.*128 characters/);
    expect(ran).toBe(false);
  });

  // An adversarial helper: '' was logged as a consumer of its own (a name left unset).
  it('refuses an empty or blank consumer name at the call', async () => {
    let ran = false;
    for (const consumer of ['', ' ', '\t']) {
      const error = await consumeOnce(dataSource, { consumer, messageId: 'm-empty' }, async () => {
        ran = true;
      }).catch((e: unknown) => e);
      expect(error).toBeInstanceOf(RangeError);
      expect((error as Error).message).toMatch(/consumer.*1 to 128 characters/);
    }
    expect(ran).toBe(false);
  });

  // Sent as UTF-8, a lone surrogate becomes U+FFFD: 'x\uD800' and 'x\uDBFF' were logged as one
  // id, and the second message was dropped as a duplicate (an adversarial helper).
  it('refuses a message id or a consumer that is not well-formed text (a lone surrogate), before any transaction', async () => {
    let ran = false;
    const messages = [
      { consumer: 'billing', messageId: 'x\uD800' },
      { consumer: 'billing', messageId: 'x\uDBFF' },
      { consumer: 'q\uD800', messageId: 'x' },
      { consumer: 'q\uDC00', messageId: 'x' },
    ];
    for (const message of messages) {
      const error = await consumeOnce(dataSource, message, async () => {
        ran = true;
      }).catch((e: unknown) => e);
      expect(error).toBeInstanceOf(RangeError);
      expect((error as Error).message).toMatch(/surrogate/);
    }
    expect(ran).toBe(false);
  });

  // NaN (a failed parse of the id) was logged as "NaN": every such message after the first was
  // dropped as its duplicate (an adversarial helper).
  it('refuses a message without an id, empty, missing or a number that is none, instead of taking every such message for the first', async () => {
    // helper-238: an integer past 2^53 (a snowflake id sent as a JSON number) is rounded by the
    // parse: 8 messages 37 apart ran 2 effects, the other 6 were acked as duplicates.
    for (const messageId of ['', undefined, NaN, Infinity, -Infinity, 1234567890123456037, -(2 ** 60), true, { a: 1 }, null]) {
      let ran = false;
      const message = { consumer: 'billing', messageId: messageId as string };
      const error = await consumeOnce(dataSource, message, async () => {
        ran = true;
      }).catch((e: unknown) => e);
      expect(error).toBeInstanceOf(RangeError);
      expect((error as Error).message).toMatch(/messageId.*an id is a non-empty string or a finite number/);
      expect(ran).toBe(false);
    }
    expect(await logged('')).toBe(0);
  });

  // A blank id (a header of spaces, a field a template filled with a zero-width space) was logged
  // as it is: every such message after the first was dropped as its duplicate (helper-224).
  it('refuses a message id of white space or invisible characters only, as one without an id', async () => {
    for (const messageId of [' ', '   ', '\t', '\u00A0', '\u200B', ' \u2060 ']) {
      let ran = false;
      const error = await consumeOnce(dataSource, { consumer: 'billing', messageId }, async () => {
        ran = true;
      }).catch((e: unknown) => e);
      expect(error).toBeInstanceOf(RangeError);
      expect((error as Error).message).toMatch(/messageId.*an id is a non-empty string or a finite number/);
      expect(ran).toBe(false);
    }
    expect(await logged('   ')).toBe(0);
  });

  it('refuses a consumer name of invisible characters only, as a blank one', async () => {
    const error = await consumeOnce(dataSource, { consumer: '\u200B', messageId: 'm-invisible' }, async () => undefined).catch((e: unknown) => e);
    expect(error).toBeInstanceOf(RangeError);
    expect((error as Error).message).toMatch(/consumer.*1 to 128 characters/);
  });
});

// An adversarial helper: copies of one message in flight, as many as the pool's connections,
// each held a connection waiting on the first's log row, and the first's work read through a
// repository outside `manager` (an injected one): no connection was left for it, and the
// consumer hung for good (a Nest RMQ app with prefetch 10 and a pool of 4 stopped consuming).
describe('consumeOnce with as many copies of one message in flight as the pool has connections', () => {
  const schema = testSchemaName();
  let dataSource: DataSource;
  beforeAll(async () => {
    dataSource = await openSchemaDataSource(schema, { entities: [ConsumeLogEntry, LedgerLine], extra: { max: 3 }, synchronize: true });
  });
  afterAll(async () => {
    await dropSchemaDataSource(dataSource);
  });

  it('takes them in turn in this process: the work reading outside its manager still gets a connection', async () => {
    const messageId = `m-pool-${randomUUID()}`;
    const copies = Array.from({ length: 6 }, () =>
      consumeOnce(dataSource, { consumer: 'billing', messageId }, async (manager) => {
        const before = await dataSource.getRepository(LedgerLine).countBy({ messageId }); // an injected repository's read
        await manager.insert(LedgerLine, { consumer: 'billing', messageId });
        return before;
      }),
    );
    let timer: NodeJS.Timeout | undefined;
    const hung = new Promise<'hung'>((resolve) => (timer = setTimeout(() => resolve('hung'), 8000)));
    const results = await Promise.race([Promise.all(copies), hung]).finally(() => clearTimeout(timer));
    expect(results).not.toBe('hung');
    const statuses = (results as Array<{ status: string }>).map((result) => result.status).sort();
    expect(statuses).toEqual(['duplicate', 'duplicate', 'duplicate', 'duplicate', 'duplicate', 'processed']);
    expect(await dataSource.getRepository(LedgerLine).countBy({ messageId })).toBe(1);
  });
});
