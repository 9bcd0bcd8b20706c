import { afterAll, beforeAll, describe, expect, it } from '@jest/globals';
import type { Pool } from 'pg';
import { Column, DataSource, Entity, PrimaryGeneratedColumn, type EntityManager } from 'typeorm';
import { ConsumeLogEntry } from './consume-log.entity.js';
import { consumeOnce } from './consume-once.js';
import { dropSchemaDataSource, openSchemaDataSource, testSchemaName } from '../../../../../test/support/test-schema.js';

/** The consumer's business effect; deliberately without a unique key, so every run shows. */
@Entity({ name: 'ledger_lines' })
class LedgerLine {
  @PrimaryGeneratedColumn()
  id!: number;

  @Column({ name: 'message_id', type: 'varchar', length: 255 })
  messageId!: string;

  @Column({ type: 'varchar', length: 128 })
  consumer!: string;
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
      entities: [ConsumeLogEntry,
      LedgerLine],
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

  it('runs the work once for 20 concurrent deliveries of one message', async () => {
    const message = { consumer: 'billing', messageId: 'm-race' };
    const results = await Promise.all(
      Array.from({ length: 20 }, () =>
        consumeOnce(dataSource, message, async (manager) => {
          const id = await book('billing', 'm-race')(manager);
          // Hold the transaction open, so the other deliveries queue on the log row.
          await manager.query('SELECT pg_sleep(0.05)');
          return id;
        }),
      ),
    );
    expect((dataSource.driver as unknown as { master: Pool }).master.totalCount).toBeGreaterThanOrEqual(10);
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

  it('lets a delivery waiting on a first one that rolls back process the message', async () => {
    const message = { consumer: 'billing', messageId: 'm-wait' };
    let logRowHeld!: () => void;
    const held = new Promise<void>((resolve) => (logRowHeld = resolve));
    const first = consumeOnce(dataSource, message, async (manager) => {
      logRowHeld();
      await manager.query('SELECT pg_sleep(0.2)');
      throw new Error('first delivery fails');
    });
    await held;
    // Starts while the first transaction holds the uncommitted log row: its insert waits for it.
    const second = consumeOnce(dataSource, message, book('billing', 'm-wait'));
    await expect(first).rejects.toThrow('first delivery fails');
    expect(await second).toMatchObject({ status: 'processed' });
    expect(await lines('m-wait')).toBe(1);
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
});
