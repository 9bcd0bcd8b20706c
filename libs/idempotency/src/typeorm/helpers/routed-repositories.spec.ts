// typeorm-transactional (`@Transactional()`, `runInTransaction`) patches TypeORM so that, while one
// of its transactions is active, every repository answers that transaction's manager. Called
// inside one, consumeOnce (and IdempotentTransactions.run, the outcome recorder's succeedWith)
// opened its own transaction, but `work`'s `manager.getRepository(X)` wrote in the outer one: the
// log row committed, the effect rolled back with the outer transaction, and every redelivery was
// answered duplicate (an adversarial helper: 50 of 50 effects lost). The real library, wired as its
// README says: initializeTransactionalContext, then addTransactionalDataSource.
import { afterAll, beforeAll, describe, expect, it } from '@jest/globals';
import { createHash, randomUUID } from 'node:crypto';
import { Column, DataSource, Entity, PrimaryGeneratedColumn, type EntityManager, type Repository } from 'typeorm';
import {
  addTransactionalDataSource,
  initializeTransactionalContext,
  Propagation,
  runInTransaction,
  StorageDriver,
} from 'typeorm-transactional';
import { IdempotencyConfigError } from '../../index.js';
import { IDEMPOTENCY_ENTITIES } from '../entities.js';
import { IDEMPOTENCY_MIGRATIONS } from '../migrations.js';
import { IDEMPOTENCY_OUTCOME_ENTITIES } from '../outcomes/outcome-record.entity.js';
import { IDEMPOTENCY_OUTCOME_MIGRATIONS } from '../outcomes/idempotency-outcomes.migration.js';
import { PostgresOutcomeRecorder } from '../outcomes/postgres-outcome-recorder.js';
import { IdempotentTransactions } from '../transactional/idempotent-transactions.js';
import { consumeOnce } from './consume-once.js';
import { insertOnce } from './insert-once.js';
import { transition } from './conditional-transition.js';
import { ConsumeLogEntry } from './consume-log.entity.js';
import { dropSchemaDataSource, openSchemaDataSource, testSchemaName } from '../../../../../test/support/test-schema.js';

/** The business effect, written through a repository as most services do. */
@Entity({ name: 'ledger_lines' })
class LedgerLine {
  @PrimaryGeneratedColumn()
  id!: number;

  @Column({ name: 'op', type: 'text' })
  op!: string;
}

/** An order by its unique number, as insertOnce is used. */
@Entity({ name: 'numbered_orders' })
class NumberedOrder {
  @PrimaryGeneratedColumn()
  id!: number;

  @Column({ name: 'order_no', type: 'text', unique: true })
  orderNo!: string;

  @Column({ type: 'text', default: 'NEW' })
  status!: string;
}

/** The outer transaction rolls back after the call returned (a later step of the method failed). */
class LaterStepFailed extends Error {}

describe('under typeorm-transactional', () => {
  const schema = testSchemaName();
  let dataSource: DataSource;
  const lines = (op: string) => dataSource.getRepository(LedgerLine).countBy({ op });
  const logged = (messageId: string) => dataSource.getRepository(ConsumeLogEntry).countBy({ messageId });
  const book = (op: string) => async (manager: EntityManager) => (await manager.getRepository(LedgerLine).insert({ op })).identifiers[0].id as number;
  /** Runs `call` in a @Transactional()-style transaction that then fails; what `call` threw or returned. */
  const inFailingTransaction = async <T>(call: () => Promise<T>): Promise<{ threw: unknown } | { returned: T }> => {
    let outcome: { threw: unknown } | { returned: T } | undefined;
    await runInTransaction(async () => {
      try {
        outcome = { returned: await call() };
      } catch (error) {
        outcome = { threw: error };
        return;
      }
      throw new LaterStepFailed();
    }).catch((error: unknown) => {
      if (!(error instanceof LaterStepFailed)) throw error;
    });
    return outcome!;
  };

  beforeAll(async () => {
    initializeTransactionalContext({ storageDriver: StorageDriver.ASYNC_LOCAL_STORAGE });
    dataSource = await openSchemaDataSource(schema, {
      entities: [...IDEMPOTENCY_ENTITIES, ...IDEMPOTENCY_OUTCOME_ENTITIES, LedgerLine, NumberedOrder],
      migrations: [...IDEMPOTENCY_MIGRATIONS, ...IDEMPOTENCY_OUTCOME_MIGRATIONS],
      migrationsRun: true,
      extra: { max: 10 },
    });
    await dataSource.query(`CREATE TABLE "${schema}".ledger_lines (id serial PRIMARY KEY, op text NOT NULL)`);
    await dataSource.query(`CREATE TABLE "${schema}".numbered_orders (id serial PRIMARY KEY, order_no text NOT NULL UNIQUE, status text NOT NULL DEFAULT 'NEW')`);
    addTransactionalDataSource(dataSource);
  });
  afterAll(async () => {
    await dropSchemaDataSource(dataSource);
  });

  it('consumeOnce refuses to run inside a transaction, before its own: nothing is logged, and the redelivery processes the message', async () => {
    const message = { consumer: 'billing', messageId: randomUUID() };
    const inside = await inFailingTransaction(() => consumeOnce(dataSource, message, book(message.messageId)));
    // Observed before: processed, the log row committed and the line rolled back; the redelivery a duplicate.
    expect(inside).toEqual({ threw: expect.any(IdempotencyConfigError) });
    expect((inside as { threw: Error }).threw.message).toMatch(/consumeOnce.*@Transactional/s);
    expect(await logged(message.messageId)).toBe(0);
    expect(await consumeOnce(dataSource, message, book(message.messageId))).toEqual({ status: 'processed', result: expect.any(Number) });
    expect({ lines: await lines(message.messageId), logged: await logged(message.messageId) }).toEqual({ lines: 1, logged: 1 });
  });

  it('consumeOnce runs as ever outside one, and where the transaction is suspended (Propagation.NOT_SUPPORTED)', async () => {
    const outside = { consumer: 'billing', messageId: randomUUID() };
    expect(await consumeOnce(dataSource, outside, book(outside.messageId))).toEqual({ status: 'processed', result: expect.any(Number) });
    const suspended = { consumer: 'billing', messageId: randomUUID() };
    const inside = await inFailingTransaction(() =>
      runInTransaction(() => consumeOnce(dataSource, suspended, book(suspended.messageId)), { propagation: Propagation.NOT_SUPPORTED }),
    );
    expect(inside).toEqual({ returned: { status: 'processed', result: expect.any(Number) } });
    expect(await Promise.all([lines(outside.messageId), lines(suspended.messageId), logged(suspended.messageId)])).toEqual([1, 1, 1]);
  });

  it('IdempotentTransactions.run refuses to run inside a transaction: no record is left to replay an effect that rolled back', async () => {
    const transactions = new IdempotentTransactions(dataSource);
    const key = `pay:${randomUUID()}`;
    const pay = async (manager: EntityManager) => ({ statusCode: 201, body: { id: await book(key)(manager) } });
    const inside = await inFailingTransaction(() => transactions.run({ key }, pay));
    // Observed before: ran, its record committed; the retry replayed a payment that was never made.
    expect(inside).toEqual({ threw: expect.any(IdempotencyConfigError) });
    expect(await transactions.run({ key }, pay)).toMatchObject({ status: 'ran', statusCode: 201 });
    expect(await lines(key)).toBe(1);
  });

  it("the outcome recorder's succeedWith refuses to run inside a transaction: the record stays processing", async () => {
    const recorder = new PostgresOutcomeRecorder(dataSource);
    const scope = `test:${randomUUID()}`;
    const claim = await recorder.claim({ scope, requestId: 'r1', contentHash: createHash('sha256').update(scope).digest('hex') });
    if (claim.status !== 'acquired') throw new Error(`not acquired: ${claim.status}`);
    const inside = await inFailingTransaction(() =>
      recorder.succeedWith(claim.held, async (manager) => ({ statusCode: 201, body: { id: await book(scope)(manager) } })),
    );
    // Observed before: recorded SUCCESS, while its effect rolled back.
    expect(inside).toEqual({ threw: expect.any(IdempotencyConfigError) });
    expect(await recorder.get(scope, { requestId: 'r1' })).toMatchObject({ state: 'PROCESSING' });
    expect(await lines(scope)).toBe(0);
  });

  // With typeorm-transactional's AsyncLocalStorage driver, the branches of one handler share one
  // routing: a sibling @Transactional() that ran beside `work` routed its writes into itself
  // after the call-time check had passed, and rolled them back (an adversarial helper: 0 of 10).
  it("keeps work's repositories in consumeOnce's transaction while a sibling @Transactional() runs beside it and fails", async () => {
    const message = { consumer: 'billing', messageId: randomUUID() };
    // In this order: the sibling's transaction begins, work writes, the sibling fails.
    let began!: () => void;
    let wrote!: () => void;
    const siblingBegan = new Promise<void>((resolve) => (began = resolve));
    const workWrote = new Promise<void>((resolve) => (wrote = resolve));
    const sibling = () =>
      runInTransaction(async () => {
        began();
        await workWrote;
        throw new LaterStepFailed();
      });
    const [consumed] = await runInTransaction(
      () =>
        Promise.allSettled([
          consumeOnce(dataSource, message, async (manager) => {
            await siblingBegan;
            try {
              return await book(message.messageId)(manager);
            } finally {
              wrote();
            }
          }),
          sibling(),
        ]),
      { propagation: Propagation.NOT_SUPPORTED },
    );
    expect(consumed).toEqual({ status: 'fulfilled', value: { status: 'processed', result: expect.any(Number) } });
    // Observed before: lines 0, logged 1 (the redelivery a duplicate).
    expect({ lines: await lines(message.messageId), logged: await logged(message.messageId) }).toEqual({ lines: 1, logged: 1 });
  });

  it('keeps a custom repository given to manager.withRepository (and its extend) in the call\'s transaction', async () => {
    const ops = [randomUUID(), randomUUID()];
    const outcome = await inFailingTransaction(async () => {
      // Made inside the outer transaction, as a request-scoped custom repository is.
      const ledger = dataSource.getRepository(LedgerLine).extend({
        book(this: Repository<LedgerLine>, op: string) {
          return this.insert({ op });
        },
      });
      return runInTransaction(
        () =>
          Promise.all(
            ops.map((op, i) =>
              consumeOnce(dataSource, { consumer: 'billing', messageId: op }, async (manager) => {
                const mine = manager.withRepository(ledger);
                return i === 0 ? mine.book(op) : mine.extend({}).insert({ op });
              }),
            ),
          ),
        { propagation: Propagation.NOT_SUPPORTED },
      );
    });
    expect(outcome).toEqual({ returned: [expect.objectContaining({ status: 'processed' }), expect.objectContaining({ status: 'processed' })] });
    // Observed before: 0 lines each, logged 1 each.
    expect(await Promise.all(ops.flatMap((op) => [lines(op), logged(op)]))).toEqual([1, 1, 1, 1]);
  });

  /**
   * Runs `call` in a @Transactional()-style transaction beside a sibling @Transactional()
   * (REQUIRES_NEW) that begins right after the transaction's statement matching `after` answered,
   * and fails once `call` is done: the timing of the adversarial helper's runs.
   */
  const besideASibling = <T>(after: RegExp, call: () => Promise<T>, before?: () => Promise<unknown>): Promise<T> => {
    let began!: () => void;
    let callDone!: () => void;
    const siblingBegan = new Promise<void>((resolve) => (began = resolve));
    const called = new Promise<void>((resolve) => (callDone = resolve));
    let siblingDone: Promise<unknown> = Promise.resolve();
    return runInTransaction(async () => {
      await before?.();
      const runner = dataSource.getRepository(NumberedOrder).manager.queryRunner!;
      const query = runner.query;
      runner.query = async function (this: unknown, ...args: Parameters<typeof query>) {
        const answer = await query.apply(runner, args);
        if (after.test(String(args[0]))) {
          siblingDone = runInTransaction(
            async () => {
              began();
              await called;
              throw new LaterStepFailed();
            },
            { propagation: Propagation.REQUIRES_NEW },
          ).catch(() => undefined);
          await siblingBegan;
        }
        return answer;
      } as typeof query;
      try {
        return await call();
      } finally {
        callDone();
        runner.query = query;
        await siblingDone;
      }
    });
  };

  // The same sibling, beside insertOnce in a @Transactional() method: its savepoint went to the
  // method's transaction and its INSERT, asked of the repository again, to the sibling's, which
  // rolled it back: `created: true`, no row (an adversarial helper: up to 9 of 9 orders lost).
  it('keeps insertOnce in the transaction it was called in while a sibling @Transactional() runs beside it and fails', async () => {
    const orderNo = randomUUID();
    // The sibling begins once insertOnce's savepoint is in place.
    const created = await besideASibling(/^SAVEPOINT idempotency_insert_once/, async () =>
      (await insertOnce(dataSource.getRepository(NumberedOrder), { orderNo }, () => ({ orderNo }))).created,
    );
    expect(created).toBe(true);
    // Observed before: 0 rows.
    expect(await dataSource.getRepository(NumberedOrder).countBy({ orderNo })).toBe(1);
  });

  it('keeps transition in the transaction it was called in while a sibling @Transactional() runs beside it', async () => {
    const orderNo = randomUUID();
    // The sibling begins once the UPDATE (which changes nothing: the order is not PAID) has answered.
    const result = await besideASibling(
      /^UPDATE/,
      () => transition(dataSource.getRepository(NumberedOrder), { where: { orderNo }, from: ['PAID'], to: 'SHIPPED', versionProperty: false }),
      () => dataSource.getRepository(NumberedOrder).insert({ orderNo }),
    );
    // Observed before: not_found (the row read in the sibling's transaction, where the order is not yet).
    expect(result).toMatchObject({ changed: false, reason: 'not_allowed' });
  });

  // TypeORM asks the manager for a repository at every save of an entity with an id; each ask
  // wrapped the cached repository's extend once more (a reviewer: out of stack past ~10,000).
  it("pins a repository once, however often work asks the manager for it", async () => {
    const message = { consumer: 'billing', messageId: randomUUID() };
    const result = await consumeOnce(dataSource, message, async (manager) => {
      const extend = manager.getRepository(LedgerLine).extend;
      for (let i = 0; i < 1000; i++) manager.getRepository(LedgerLine);
      const same = manager.getRepository(LedgerLine).extend === extend;
      await manager.getRepository(LedgerLine).extend({}).insert({ op: message.messageId });
      return same;
    });
    // Observed before: a new wrapper at every ask (false).
    expect(result).toEqual({ status: 'processed', result: true });
    expect(await lines(message.messageId)).toBe(1);
  });
});
