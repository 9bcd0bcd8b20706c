import { afterAll, beforeAll, describe, expect, it, jest } from '@jest/globals';
import { Logger } from '@nestjs/common';
import type { Pool } from 'pg';
import { randomUUID } from 'node:crypto';
import {
  Column,
  DataSource,
  Entity,
  EventSubscriber,
  Index,
  BeforeInsert,
  CreateDateColumn,
  PrimaryColumn,
  PrimaryGeneratedColumn,
  QueryFailedError,
  Repository,
  type FindOptionsWhere,
  type QueryDeepPartialEntity,
  type EntitySubscriberInterface,
  type InsertEvent,
  type QueryRunner,
  type TransactionCommitEvent,
  type TransactionRollbackEvent,
} from 'typeorm';
import { insertOnce } from './insert-once.js';
import { createTestSchema, dropSchemaDataSource, dropTestSchema, openSchemaDataSource, testSchemaName } from '../../../../../test/support/test-schema.js';
import { DATABASE_URL } from '../../../../../test/support/services.js';

@Entity({ name: 'bookings' })
@Index('uq_bookings_reference', ['reference'], { unique: true })
class Booking {
  @PrimaryGeneratedColumn('uuid')
  id!: string;

  @Column({ type: 'varchar', length: 64 })
  reference!: string;

  @Column({ type: 'varchar', length: 64 })
  guest!: string;

  @Column({ name: 'created_at', type: 'timestamptz', default: () => 'now()' })
  createdAt!: Date;
}

/** Its unique code checked at COMMIT (`DEFERRABLE INITIALLY DEFERRED`, made by SQL in the test). */
@Entity({ name: 'tickets', synchronize: false })
class Ticket {
  @PrimaryGeneratedColumn()
  id!: number;

  @Column({ type: 'text' })
  code!: string;
}

/** The same, in a schema the entity does not name, found on the session's `search_path`. */
@Entity({ name: 'path_tickets', synchronize: false })
class PathTicket {
  @PrimaryGeneratedColumn()
  id!: number;

  @Column({ type: 'text' })
  code!: string;
}

/** A partitioned table (made by SQL in the test): PostgreSQL names the partition in its errors. */
@Entity({ name: 'regional_events', synchronize: false })
class RegionalEvent {
  @PrimaryGeneratedColumn()
  id!: number;

  @PrimaryColumn({ type: 'text' })
  region!: string;

  @Column({ type: 'text' })
  ref!: string;
}

/** An audit trail with a unique reference of its own, written by a subscriber after a booking. */
@Entity({ name: 'audit_lines' })
@Index('uq_audit_lines_ref', ['ref'], { unique: true })
class AuditLine {
  @PrimaryGeneratedColumn()
  id!: number;

  @Column({ type: 'varchar', length: 64 })
  ref!: string;
}

/** Its id set in JS before the INSERT (`@BeforeInsert`, as uuidv7 or ULID ids are), its code unique. */
@Entity({ name: 'passes' })
@Index('uq_passes_code', ['code'], { unique: true })
class Pass {
  @PrimaryColumn({ type: 'uuid' })
  id!: string;

  @Column({ type: 'varchar', length: 64 })
  code!: string;

  @BeforeInsert()
  setId() {
    this.id ??= randomUUID();
  }
}

/** A natural key and no generated column; codes `audited-*` write the same audit line. */
@Entity({ name: 'vouchers' })
class Voucher {
  @PrimaryColumn({ type: 'varchar', length: 64 })
  code!: string;

  @CreateDateColumn({ name: 'created_at', type: 'timestamptz' })
  createdAt!: Date;
}

@EventSubscriber()
class VoucherAudit implements EntitySubscriberInterface<Voucher> {
  listenTo() {
    return Voucher;
  }
  async afterInsert(event: InsertEvent<Voucher>): Promise<void> {
    if (event.entity?.code.startsWith('audited')) await event.manager.insert(AuditLine, { ref: 'voucher-fixed' });
    // An idempotent outbox row, written by insertOnce inside the voucher's own insertOnce.
    if (event.entity?.code.startsWith('outbox-many')) {
      const refs = [1, 2, 3].map((n) => `outbox-many-of-${event.entity!.code}-${n}`);
      await Promise.all(refs.map((ref) => insertOnce(event.manager.getRepository(AuditLine), { ref }, () => ({ ref }))));
    } else if (event.entity?.code.startsWith('outbox')) {
      const ref = `outbox-of-${event.entity.code}`;
      await insertOnce(event.manager.getRepository(AuditLine), { ref }, () => ({ ref }));
    }
    if (event.entity?.code.startsWith('raw-audited')) {
      // Raw SQL that starts with a comment, and one with a comment inside (round 7).
      const table = event.connection.getMetadata(AuditLine).tablePath.split('.').map((part) => `"${part}"`).join('.');
      await event.manager.query(`-- audit trail\nINSERT /* raw */ INTO ${table} (ref) VALUES ('voucher-raw')`);
    }
  }
}

/** A table name with a space in it. */
@Entity({ name: 'gift cards' })
@Index('uq_gift_cards_code', ['code'], { unique: true })
class GiftCard {
  @PrimaryGeneratedColumn()
  id!: number;

  @Column({ type: 'varchar', length: 64 })
  code!: string;
}

/** What a subscriber reading through the DataSource (another connection) saw of a `seen` booking. */
const seenElsewhere: Array<string | null> = [];
let readElsewhere: ((reference: string) => Promise<string | null>) | undefined;

/** Bookings of the guest `audited` write the same audit line: the second one's is refused. */
@EventSubscriber()
class AuditTrail implements EntitySubscriberInterface<Booking> {
  listenTo() {
    return Booking;
  }
  async afterInsert(event: InsertEvent<Booking>): Promise<void> {
    if (event.entity?.guest === 'audited') await event.manager.insert(AuditLine, { ref: 'audit-fixed' });
    if (event.entity?.guest === 'seen') seenElsewhere.push((await readElsewhere?.(event.entity.reference)) ?? null);
  }
}

/**
 * The usual "publish domain events after commit" subscriber: an insert queues its event on the
 * transaction's QueryRunner, a commit publishes the queue, a rollback drops it.
 */
const published: string[] = [];
const queued = new WeakMap<QueryRunner, string[]>();

@EventSubscriber()
class DomainEvents implements EntitySubscriberInterface {
  afterInsert(event: InsertEvent<{ reference?: string }>): void {
    const queue = queued.get(event.queryRunner) ?? [];
    queue.push(`${event.metadata.name} ${event.entity?.reference ?? '?'}`);
    queued.set(event.queryRunner, queue);
  }
  afterTransactionCommit(event: TransactionCommitEvent): void {
    published.push(...(queued.get(event.queryRunner) ?? []));
    queued.delete(event.queryRunner);
  }
  afterTransactionRollback(event: TransactionRollbackEvent): void {
    queued.delete(event.queryRunner);
  }
}

describe('insertOnce (PostgreSQL)', () => {
  const schema = testSchemaName();
  let dataSource: DataSource;
  const count = async (reference: string) =>
    dataSource.getRepository(Booking).countBy({ reference });
  const byReference = (reference: string) => () => ({ reference });

  beforeAll(async () => {
    dataSource = await openSchemaDataSource(schema, {
      entities: [Booking, AuditLine, RegionalEvent, Pass, Voucher, GiftCard, Ticket],
      subscribers: [DomainEvents, AuditTrail, VoucherAudit],
      extra: { max: 30 },
      synchronize: true,
    });
  });
  afterAll(async () => {
    await dropSchemaDataSource(dataSource);
  });

  it('inserts a new row and returns it with the database defaults', async () => {
    const result = await insertOnce(dataSource.getRepository(Booking), { reference: 'R-new', guest: 'ann' }, byReference('R-new'));
    expect(result.created).toBe(true);
    expect(result.entity).toMatchObject({ reference: 'R-new', guest: 'ann' });
    expect(result.entity.id).toMatch(/^[0-9a-f-]{36}$/);
    expect(result.entity.createdAt).toBeInstanceOf(Date);
  });

  it('lets exactly one of 20 concurrent inserts of one key create the row; the rest get that row', async () => {
    const repo = dataSource.getRepository(Booking);
    const results = await Promise.all(
      Array.from({ length: 20 }, (_, i) => insertOnce(repo, { reference: 'R-race', guest: `guest-${i}` }, byReference('R-race'))),
    );
    // The 20 really ran side by side, each on its own connection.
    expect((dataSource.driver as unknown as { master: Pool }).master.totalCount).toBeGreaterThanOrEqual(10);
    expect(await count('R-race')).toBe(1);
    const created = results.filter((r) => r.created);
    const found = results.filter((r) => !r.created);
    expect(created).toHaveLength(1);
    expect(found).toHaveLength(19);
    for (const result of found) {
      expect(result).toMatchObject({ entity: { id: created[0].entity.id, guest: created[0].entity.guest }, constraint: 'uq_bookings_reference' });
    }
  });

  // helper-238: a business number past 2^53 sent as a JSON number is rounded by the parse: the
  // order ...037 was refused as the duplicate of ...000, and answered with ...000's row.
  it('refuses to answer a row named by an integer past 2^53, which a JSON parse rounds to another', async () => {
    const repo = dataSource.getRepository(Booking);
    const first = 1234567890123456000;
    await insertOnce(repo, { reference: String(first), guest: 'first' }, byReference(String(first)));
    const rounded = 1234567890123456037; // read as 1234567890123456000
    const error = await insertOnce(repo, { reference: String(rounded), guest: 'second' }, () => ({ reference: rounded as unknown as string })).catch((e: unknown) => e);
    expect(error).toBeInstanceOf(RangeError);
    expect((error as Error).message).toMatch(/findExisting.*integer past 2\^53/);
  });

  it('keeps a surrounding transaction usable: it carries on and commits its other work', async () => {
    await insertOnce(dataSource.getRepository(Booking), { reference: 'R-tx', guest: 'first' }, byReference('R-tx'));
    const outcome = await dataSource.transaction(async (manager) => {
      const repo = manager.getRepository(Booking);
      await repo.insert({ reference: 'R-tx-before', guest: 'tx' });
      const duplicate = await insertOnce(repo, { reference: 'R-tx', guest: 'second' }, byReference('R-tx'));
      const fresh = await insertOnce(repo, { reference: 'R-tx-fresh', guest: 'tx' }, byReference('R-tx-fresh'));
      // Without the savepoint PostgreSQL refuses this: "current transaction is aborted".
      await repo.insert({ reference: 'R-tx-after', guest: 'tx' });
      return { duplicate, fresh };
    });
    expect(outcome.duplicate).toMatchObject({ created: false, entity: { guest: 'first' }, constraint: 'uq_bookings_reference' });
    expect(outcome.fresh.created).toBe(true);
    for (const reference of ['R-tx-before', 'R-tx-fresh', 'R-tx-after']) expect(await count(reference)).toBe(1);
  });

  it("fires no commit event of its own: a row it inserted in a transaction that rolls back is never published", async () => {
    published.length = 0;
    const rolledBack = dataSource.transaction(async (manager) => {
      await insertOnce(manager.getRepository(Booking), { reference: 'R-ev-undone', guest: 'tx' }, byReference('R-ev-undone'));
      throw new Error('a later business rule fails');
    });
    await expect(rolledBack).rejects.toThrow('a later business rule fails');
    expect(await count('R-ev-undone')).toBe(0);
    expect(published).toEqual([]);
  });

  it('fires no rollback event of its own: a row inserted before a duplicate is published when the transaction commits', async () => {
    await insertOnce(dataSource.getRepository(Booking), { reference: 'R-ev-taken', guest: 'first' }, byReference('R-ev-taken'));
    published.length = 0;
    await dataSource.transaction(async (manager) => {
      await manager.getRepository(Booking).insert({ reference: 'R-ev-kept', guest: 'tx' });
      const duplicate = await insertOnce(manager.getRepository(Booking), { reference: 'R-ev-taken', guest: 'tx' }, byReference('R-ev-taken'));
      expect(duplicate.created).toBe(false);
    });
    expect(await count('R-ev-kept')).toBe(1);
    expect(published).toEqual(['Booking R-ev-kept']);
  });

  // An adversarial helper (session 20): `Promise.all` over one transaction's manager interleaved
  // the calls' savepoints (SAVEPOINT a; SAVEPOINT b; ... RELEASE a, which releases b too), and
  // b's RELEASE aborted the transaction: rows answered `created: true` were never committed.
  it('takes concurrent calls on one transaction in turn: every row answered created is committed, duplicates found', async () => {
    await insertOnce(dataSource.getRepository(Booking), { reference: 'R-par-taken', guest: 'first' }, byReference('R-par-taken'));
    const references = ['R-par-1', 'R-par-taken', 'R-par-2', 'R-par-3', 'R-par-taken', 'R-par-4'];
    const results = await dataSource.transaction((manager) =>
      Promise.all(references.map((reference) => insertOnce(manager.getRepository(Booking), { reference, guest: 'tx' }, byReference(reference)))),
    );
    expect(results.map((r) => r.created)).toEqual([true, false, true, true, false, true]);
    for (const reference of ['R-par-1', 'R-par-2', 'R-par-3', 'R-par-4', 'R-par-taken']) expect(await count(reference)).toBe(1);
    const settled = await dataSource.transaction((manager) =>
      Promise.allSettled(['R-par-5', 'R-par-6'].map((reference) => insertOnce(manager.getRepository(Booking), { reference, guest: 'tx' }, byReference(reference)))),
    );
    expect(settled.map((r) => r.status)).toEqual(['fulfilled', 'fulfilled']);
    for (const reference of ['R-par-5', 'R-par-6']) expect(await count(reference)).toBe(1);
  });

  // A third round: a queued call had its turn after the transaction had rolled back (a call
  // beside it failed), and its INSERT went in outside any transaction, committed.
  it('refuses the calls waiting beside one that failed: nothing commits after the rollback', async () => {
    const tooLong = 'g'.repeat(100); // over the column's 64: not a duplicate, a failure
    const failed = dataSource.transaction((manager) =>
      Promise.all(
        [['R-after-1', 'tx'], ['R-after-2', tooLong], ['R-after-3', 'tx'], ['R-after-4', 'tx']].map(([reference, guest]) =>
          insertOnce(manager.getRepository(Booking), { reference, guest }, byReference(reference)),
        ),
      ),
    );
    await expect(failed).rejects.toThrow();
    await new Promise((resolve) => setTimeout(resolve, 200)); // what would still run has run
    for (const reference of ['R-after-1', 'R-after-2', 'R-after-3', 'R-after-4']) expect(await count(reference)).toBe(0);
    // A later call on another transaction runs.
    expect((await insertOnce(dataSource.getRepository(Booking), { reference: 'R-after-5', guest: 'x' }, byReference('R-after-5'))).created).toBe(true);
  });

  // A third round: a promise beside the call in the app's Promise.all failed while the call's
  // SAVEPOINT was on its way; the app's ROLLBACK went out, then the INSERT, which committed on
  // its own. The sibling fails at that moment here, on cue.
  it('inserts nothing once the app rolls back for a promise beside it that failed during its SAVEPOINT', async () => {
    const reference = 'R-sibling';
    const failed = dataSource.transaction((manager) => {
      const runner = manager.queryRunner!;
      let refuse!: (error: Error) => void;
      const sibling = new Promise((_resolve, reject) => (refuse = reject));
      const query = runner.query.bind(runner) as (sql: string, ...rest: unknown[]) => Promise<unknown>;
      runner.query = ((sql: string, ...rest: unknown[]) => {
        const sent = query(sql, ...rest);
        if (sql.startsWith('SAVEPOINT idempotency_insert_once')) refuse(new Error('the app refused the order'));
        return sent;
      }) as typeof runner.query;
      return Promise.all([insertOnce(manager.getRepository(Booking), { reference, guest: 'tx' }, byReference(reference)), sibling]);
    });
    await expect(failed).rejects.toThrow('the app refused the order');
    await new Promise((resolve) => setTimeout(resolve, 200));
    expect(await count(reference)).toBe(0);
  });

  // A fourth round: the same on a transaction begun with a raw BEGIN, which fires no rollback
  // event. The app's ROLLBACK went out between the call's SAVEPOINT and its INSERT, and the INSERT
  // committed on its own (14 of 100 rolled-back transactions). On cue here: the ROLLBACK is asked
  // right behind the SAVEPOINT. The INSERT is refused before it is sent: deleting its row again
  // afterwards (a first fix) took it from a concurrent call already answered `created: false`.
  it('never sends the INSERT once the app asked for a ROLLBACK of its raw BEGIN during the SAVEPOINT', async () => {
    const reference = 'R-raw-cut';
    const runner = dataSource.createQueryRunner();
    await runner.query('BEGIN');
    const query = runner.query.bind(runner) as (sql: string, ...rest: unknown[]) => Promise<unknown>;
    const asked: string[] = [];
    let rolledBack: Promise<unknown> | undefined;
    runner.query = ((sql: string, ...rest: unknown[]) => {
      asked.push(sql.split(' ')[0]!);
      const sent = query(sql, ...rest);
      if (sql.startsWith('SAVEPOINT idempotency_insert_once')) rolledBack = query('ROLLBACK');
      return sent;
    }) as typeof runner.query;
    try {
      const call = insertOnce(runner.manager.getRepository(Booking), { reference, guest: 'raw' }, byReference(reference));
      await expect(call).rejects.toThrow(/the transaction is rolling back, so this call did not insert/);
      await rolledBack;
    } finally {
      await runner.release();
    }
    // The INSERT was never asked (run after the ROLLBACK, on its own, it committed).
    expect(asked).toEqual(['SAVEPOINT']);
    expect(await count(reference)).toBe(0);
  });

  // The same, with the ROLLBACK asked after the SAVEPOINT's answer and before the INSERT is
  // asked (on cue: from a beforeInsert subscriber, which TypeORM runs in between).
  it('never sends the INSERT once the app asked for a ROLLBACK of its raw BEGIN after the SAVEPOINT', async () => {
    const reference = 'R-raw-cut-late';
    const runner = dataSource.createQueryRunner();
    await runner.query('BEGIN');
    let rolledBack: Promise<unknown> | undefined;
    const cue: EntitySubscriberInterface = {
      beforeInsert: (event) => {
        if (event.queryRunner === runner && !rolledBack) rolledBack = runner.query('ROLLBACK');
      },
    };
    dataSource.subscribers.push(cue);
    try {
      const call = insertOnce(runner.manager.getRepository(Booking), { reference, guest: 'raw' }, byReference(reference));
      await expect(call).rejects.toThrow(/has ended or is ending .* not sent/);
      await rolledBack;
    } finally {
      dataSource.subscribers.splice(dataSource.subscribers.indexOf(cue), 1);
      await runner.release();
    }
    expect(rolledBack).toBeDefined();
    expect(await count(reference)).toBe(0);
  });

  // A fifth round (session 21): what ends a transaction, and which transaction a call belongs to.
  it('sees a ROLLBACK behind a comment or after another statement: nothing commits after it', async () => {
    for (const rollback of ['/* app */ ROLLBACK', '-- app\nROLLBACK', 'SELECT 1; ROLLBACK']) {
      const reference = `R-seen-${rollback.length}`;
      const runner = dataSource.createQueryRunner();
      await runner.query('BEGIN');
      const query = runner.query.bind(runner) as (sql: string, ...rest: unknown[]) => Promise<unknown>;
      let rolledBack: Promise<unknown> | undefined;
      runner.query = ((sql: string, ...rest: unknown[]) => {
        const sent = query(sql, ...rest);
        if (sql.startsWith('SAVEPOINT idempotency_insert_once')) rolledBack = query(rollback);
        return sent;
      }) as typeof runner.query;
      try {
        await expect(insertOnce(runner.manager.getRepository(Booking), { reference, guest: 'raw' }, byReference(reference))).rejects.toThrow(
          /did not insert/,
        );
        await rolledBack;
      } finally {
        await runner.release();
      }
      expect({ rollback, rows: await count(reference) }).toEqual({ rollback, rows: 0 });
    }
  });

  it('keeps the outer transaction going after a nested one rolled back: a later call inserts', async () => {
    const result = await dataSource.transaction(async (manager) => {
      await insertOnce(manager.getRepository(Booking), { reference: 'R-nest-1', guest: 'tx' }, byReference('R-nest-1'));
      await manager.transaction(async () => Promise.reject(new Error('inner'))).catch(() => undefined);
      return insertOnce(manager.getRepository(Booking), { reference: 'R-nest-2', guest: 'tx' }, byReference('R-nest-2'));
    });
    expect(result.created).toBe(true);
    for (const reference of ['R-nest-1', 'R-nest-2']) expect(await count(reference)).toBe(1);
  });

  it("refuses a call left over from a rolled-back transaction in the runner's next one, whose own calls insert", async () => {
    const runner = dataSource.createQueryRunner();
    try {
      await runner.query('BEGIN');
      const repo = runner.manager.getRepository(Booking);
      // Asked in the first transaction, and still waiting for its turn when the next begins.
      const first = insertOnce(repo, { reference: 'R-left-1', guest: 'job-1' }, byReference('R-left-1'));
      const leftOver = insertOnce(repo, { reference: 'R-left-2', guest: 'job-1' }, byReference('R-left-2'));
      void runner.query('ROLLBACK'); // not awaited: the job gave up
      await runner.query('BEGIN'); // the next job on the runner
      const next = insertOnce(repo, { reference: 'R-left-3', guest: 'job-2' }, byReference('R-left-3'));
      const settled = await Promise.allSettled([first, leftOver, next]);
      await runner.query('COMMIT');
      expect(settled.map((r) => r.status)).toEqual(['rejected', 'rejected', 'fulfilled']);
    } finally {
      await runner.release();
    }
    expect([await count('R-left-1'), await count('R-left-2'), await count('R-left-3')]).toEqual([0, 0, 1]);
  });

  // A sixth round: the app's manager.query('ROLLBACK') in a dataSource.transaction callback that
  // then returns, so TypeORM sends its COMMIT; a call whose INSERT went out before the ROLLBACK
  // and finished after the COMMIT was answered created, for a row that is not there (35 of 40).
  it('keeps a rollback a rollback when TypeORM commits after the app rolled back in its callback', async () => {
    let call: Promise<unknown> | undefined;
    await dataSource.transaction(async (manager) => {
      const runner = manager.queryRunner!;
      const query = runner.query.bind(runner) as (sql: string, ...rest: unknown[]) => Promise<unknown>;
      let inserted!: () => void;
      const insertAsked = new Promise<void>((resolve) => (inserted = resolve));
      runner.query = ((sql: string, ...rest: unknown[]) => {
        const sent = query(sql, ...rest);
        if (!sql.startsWith('INSERT')) return sent;
        inserted();
        // Its answer comes back late (an afterInsert subscriber's own work).
        return sent.then(async (answer) => new Promise((resolve) => setTimeout(() => resolve(answer), 30)));
      }) as typeof runner.query;
      call = insertOnce(manager.getRepository(Booking), { reference: 'R-rb-commit', guest: 'tx' }, byReference('R-rb-commit'));
      call.catch(() => undefined);
      await insertAsked;
      await manager.query('ROLLBACK');
    });
    await expect(call).rejects.toThrow(/rolled back after this call inserted/);
    expect(await count('R-rb-commit')).toBe(0);
  });

  // A seventh round: an async beforeQuery subscriber reorders a runner's statements (26 of 40
  // rolled-back rows committed). Not something insertOnce can see per statement: said, once.
  it('says once that an async beforeQuery subscriber lets statements out of order', async () => {
    class Tracing implements EntitySubscriberInterface {
      async beforeQuery(): Promise<void> {}
    }
    const tracing = new Tracing();
    const warn = jest.spyOn(Logger.prototype, 'warn').mockImplementation(() => undefined);
    dataSource.subscribers.push(tracing);
    try {
      for (const reference of ['R-async-1', 'R-async-2']) await insertOnce(dataSource.getRepository(Booking), { reference, guest: 'x' }, byReference(reference));
      const said = warn.mock.calls.map(([message]) => String(message)).filter((message) => message.includes('async beforeQuery'));
      expect(said).toEqual([expect.stringContaining('Tracing has an async beforeQuery')]);
    } finally {
      dataSource.subscribers.splice(dataSource.subscribers.indexOf(tracing), 1);
      warn.mockRestore();
    }
  });

  it('answers created when the app asked for its COMMIT after the INSERT went out (the COMMIT keeps the row)', async () => {
    const runner = dataSource.createQueryRunner();
    try {
      await runner.query('BEGIN');
      const query = runner.query.bind(runner) as (sql: string, ...rest: unknown[]) => Promise<unknown>;
      let committed: Promise<unknown> | undefined;
      runner.query = ((sql: string, ...rest: unknown[]) => {
        const sent = query(sql, ...rest);
        if (sql.startsWith('INSERT')) committed = query('COMMIT');
        return sent;
      }) as typeof runner.query;
      const result = await insertOnce(runner.manager.getRepository(Booking), { reference: 'R-commit-early', guest: 'raw' }, byReference('R-commit-early'));
      await committed;
      expect(result.created).toBe(true);
    } finally {
      await runner.release();
    }
    expect(await count('R-commit-early')).toBe(1);
  });

  it("takes the turns of a subscriber's calls made together, inside the call whose INSERT runs them", async () => {
    const results = await dataSource.transaction(async (manager) =>
      insertOnce(manager.getRepository(Voucher), { code: 'outbox-many-1' }, () => ({ code: 'outbox-many-1' })),
    );
    expect(results.created).toBe(true);
    for (const n of [1, 2, 3]) expect(await dataSource.getRepository(AuditLine).countBy({ ref: `outbox-many-of-outbox-many-1-${n}` })).toBe(1);
  });

  // An adversarial helper (session 20): the turns above made this call wait for the call whose
  // INSERT was running its subscriber, and the transaction hung.
  it("nests a subscriber's own insertOnce inside the call whose INSERT runs it, in a transaction", async () => {
    const results = await dataSource.transaction(async (manager) => [
      await insertOnce(manager.getRepository(Voucher), { code: 'outbox-1' }, () => ({ code: 'outbox-1' })),
      await insertOnce(manager.getRepository(Voucher), { code: 'outbox-1' }, () => ({ code: 'outbox-1' })),
    ]);
    expect(results.map((r) => r.created)).toEqual([true, false]);
    expect(await dataSource.getRepository(AuditLine).countBy({ ref: 'outbox-of-outbox-1' })).toBe(1);
  });

  it('keeps a transaction begun with a raw BEGIN on a QueryRunner usable after a duplicate', async () => {
    await insertOnce(dataSource.getRepository(Booking), { reference: 'R-raw', guest: 'first' }, byReference('R-raw'));
    const runner = dataSource.createQueryRunner();
    await runner.query('BEGIN');
    try {
      const repo = runner.manager.getRepository(Booking);
      const duplicate = await insertOnce(repo, { reference: 'R-raw', guest: 'second' }, byReference('R-raw'));
      await repo.insert({ reference: 'R-raw-after', guest: 'raw' });
      await runner.query('COMMIT');
      expect(duplicate).toMatchObject({ created: false, entity: { guest: 'first' } });
    } catch (error) {
      await runner.query('ROLLBACK');
      throw error;
    } finally {
      await runner.release();
    }
    expect(await count('R-raw-after')).toBe(1);
  });

  it('rethrows the unique violation when the existing row cannot be found', async () => {
    const repo = dataSource.getRepository(Booking);
    await repo.insert({ reference: 'R-gone', guest: 'first' });
    const error = await insertOnce(repo, { reference: 'R-gone', guest: 'second' }, byReference('R-elsewhere')).catch(
      (e: unknown) => e,
    );
    expect(error).toBeInstanceOf(QueryFailedError);
    expect((error as QueryFailedError<Error & { code: string }>).driverError.code).toBe('23505');
  });

  // Outside a transaction the booking commits before its subscriber's audit insert is refused:
  // that violation is another table's, and the row insertOnce would find is the one it just made
  // (found by an adversarial helper: it answered created: false with its own row).
  it("rethrows a unique violation of another table's constraint (a subscriber's write) instead of calling it a duplicate", async () => {
    const repo = dataSource.getRepository(Booking);
    expect(await insertOnce(repo, { reference: 'R-audit-1', guest: 'audited' }, byReference('R-audit-1'))).toMatchObject({ created: true });
    const error = await insertOnce(repo, { reference: 'R-audit-2', guest: 'audited' }, byReference('R-audit-2')).catch((e: unknown) => e);
    expect(error).toBeInstanceOf(QueryFailedError);
    expect((error as QueryFailedError<Error & { constraint: string }>).driverError.constraint).toBe('uq_audit_lines_ref');
  });

  // The violation names the partition (regional_events_eu), not the entity's table: a duplicate
  // all the same (an adversarial helper found a table-name check that rethrew it).
  // A duplicate of a deferred unique constraint went through the INSERT: created was answered,
  // and the COMMIT failed on every retry (an adversarial helper).
  it('refuses a call in a transaction on a table whose unique constraint is checked at COMMIT; outside one, finds the row', async () => {
    await dataSource.query(
      `CREATE TABLE "${schema}".tickets (id serial PRIMARY KEY, code text NOT NULL, ` +
        `CONSTRAINT uq_tickets_code UNIQUE (code) DEFERRABLE INITIALLY DEFERRED)`,
    );
    const repo = dataSource.getRepository(Ticket);
    const byCode = () => ({ code: 'T1' });
    const first = await insertOnce(repo, { code: 'T1' }, byCode);
    expect(await insertOnce(repo, { code: 'T1' }, byCode)).toMatchObject({ created: false, entity: { id: first.entity.id } });
    const inTransaction = dataSource.transaction((manager) => insertOnce(manager.getRepository(Ticket), { code: 'T1' }, byCode));
    // Observed before: created true, then the COMMIT failed (duplicate key value violates uq_tickets_code).
    await expect(inTransaction).rejects.toThrow(/uq_tickets_code is DEFERRABLE INITIALLY DEFERRED/);
    expect(await repo.countBy({ code: 'T1' })).toBe(1);
  });

  it('finds the existing row of a partitioned table, outside and inside a transaction', async () => {
    await dataSource.query(
      `CREATE TABLE "${schema}".regional_events (id serial, region text NOT NULL, ref text NOT NULL, ` +
        `PRIMARY KEY (region, id), UNIQUE (region, ref)) PARTITION BY LIST (region)`,
    );
    await dataSource.query(`CREATE TABLE "${schema}".regional_events_eu PARTITION OF "${schema}".regional_events FOR VALUES IN ('eu')`);
    const repo = dataSource.getRepository(RegionalEvent);
    const byRef = () => ({ region: 'eu', ref: 'E1' });
    const first = await insertOnce(repo, { region: 'eu', ref: 'E1' }, byRef);
    expect(first.created).toBe(true);
    expect(await insertOnce(repo, { region: 'eu', ref: 'E1' }, byRef)).toMatchObject({ created: false, entity: { id: first.entity.id } });
    await dataSource.transaction(async (manager) => {
      const again = await insertOnce(manager.getRepository(RegionalEvent), { region: 'eu', ref: 'E1' }, byRef);
      expect(again).toMatchObject({ created: false, entity: { id: first.entity.id } });
    });
  });

  // Round 4 of the adversaries, against a fix that gave such an insert a transaction of its
  // own: a subscriber reading or writing through the DataSource no longer saw the new row, and a
  // custom repository's insert was skipped. As repo.insert does, outside a transaction.
  it('outside a transaction: the row is there for a subscriber on another connection, and a custom repository\'s insert runs', async () => {
    readElsewhere = async (reference) => (await dataSource.getRepository(Booking).findOneBy({ reference }))?.reference ?? null;
    seenElsewhere.length = 0;
    await insertOnce(dataSource.getRepository(Booking), { reference: 'R-seen', guest: 'seen' }, byReference('R-seen'));
    expect(seenElsewhere).toEqual(['R-seen']);
    const custom = dataSource.getRepository(Booking).extend({
      insert(this: Repository<Booking>, values: QueryDeepPartialEntity<Booking>) {
        return Repository.prototype.insert.call(this, { ...values, guest: 'set by the repository' });
      },
    });
    const made = await insertOnce(custom, { reference: 'R-custom', guest: 'caller' }, byReference('R-custom'));
    expect(made.created).toBe(true);
    expect(await dataSource.getRepository(Booking).findOneByOrFail({ reference: 'R-custom' })).toMatchObject({ guest: 'set by the repository' });
  });

  // Round 5 of the adversaries, against a check by the generated values the INSERT set: an id
  // set before the INSERT rethrew every real duplicate; a natural key let a subscriber's refused
  // write pass for a duplicate.
  it('answers a real duplicate of an entity whose id is set before the INSERT, and rethrows a subscriber\'s violation on a natural key', async () => {
    const passes = dataSource.getRepository(Pass);
    const first = await insertOnce(passes, { code: 'P-1' }, () => ({ code: 'P-1' }));
    expect(await insertOnce(passes, { code: 'P-1' }, () => ({ code: 'P-1' }))).toMatchObject({ created: false, entity: { id: first.entity.id } });
    const vouchers = dataSource.getRepository(Voucher);
    expect(await insertOnce(vouchers, { code: 'audited-1' }, () => ({ code: 'audited-1' }))).toMatchObject({ created: true });
    const error = await insertOnce(vouchers, { code: 'audited-2' }, () => ({ code: 'audited-2' })).catch((e: unknown) => e);
    expect((error as QueryFailedError<Error & { constraint: string }>).driverError?.constraint).toBe('uq_audit_lines_ref');
  });

  // Round 6 of the adversaries: a repository whose INSERT starts with a comment (or is written
  // in lower case) had its real duplicates rethrown by a check of the statement's first words.
  it("answers a real duplicate through a repository whose INSERT carries a comment", async () => {
    const commented = dataSource.getRepository(Pass).extend({
      insert(this: Repository<Pass>, values: QueryDeepPartialEntity<Pass>) {
        return this.createQueryBuilder().insert().values(values).comment('svc=passes').execute();
      },
    });
    const first = await insertOnce(commented, { code: 'P-comment' }, () => ({ code: 'P-comment' }));
    expect(await insertOnce(commented, { code: 'P-comment' }, () => ({ code: 'P-comment' }))).toMatchObject({
      created: false,
      entity: { id: first.entity.id },
    });
  });

  // Round 7 of the adversaries: a table name with a space was read as another table (its real
  // duplicates rethrown), and raw SQL with comments as unreadable (a subscriber's violation taken
  // for a duplicate).
  it('answers a duplicate in a table named with a space, and rethrows a subscriber\'s commented raw INSERT', async () => {
    const cards = dataSource.getRepository(GiftCard);
    const first = await insertOnce(cards, { code: 'G-1' }, () => ({ code: 'G-1' }));
    expect(await insertOnce(cards, { code: 'G-1' }, () => ({ code: 'G-1' }))).toMatchObject({ created: false, entity: { id: first.entity.id } });
    const vouchers = dataSource.getRepository(Voucher);
    expect(await insertOnce(vouchers, { code: 'raw-audited-1' }, () => ({ code: 'raw-audited-1' }))).toMatchObject({ created: true });
    const error = await insertOnce(vouchers, { code: 'raw-audited-2' }, () => ({ code: 'raw-audited-2' })).catch((e: unknown) => e);
    expect((error as QueryFailedError<Error & { constraint: string }>).driverError?.constraint).toBe('uq_audit_lines_ref');
  });

  it('rethrows other errors without looking for an existing row', async () => {
    let looked = false;
    const error = await insertOnce(dataSource.getRepository(Booking), { reference: 'R-bad', guest: 'x'.repeat(65) }, () => {
      looked = true;
      return { reference: 'R-bad' };
    }).catch((e: unknown) => e);
    expect((error as QueryFailedError<Error & { code: string }>).driverError.code).toBe('22001');
    expect(looked).toBe(false);
  });
});

// The table on the search_path behind another schema: the check read current_schema() only, and
// a duplicate was answered created (a helper, this session's second round).
describe('insertOnce on a table the search_path finds in a later schema', () => {
  const schema = testSchemaName();
  let dataSource: DataSource;
  beforeAll(async () => {
    await createTestSchema(schema);
    dataSource = new DataSource({ type: 'postgres', url: DATABASE_URL, entities: [PathTicket], extra: { options: `-c search_path=public,${schema}` } });
    await dataSource.initialize();
    await dataSource.query(`CREATE TABLE "${schema}".path_tickets (id serial PRIMARY KEY, code text NOT NULL, CONSTRAINT uq_path_tickets_code UNIQUE (code) DEFERRABLE INITIALLY DEFERRED)`);
  });
  afterAll(async () => {
    await dataSource?.destroy();
    await dropTestSchema(schema);
  });

  it('refuses it in a transaction as it refuses one the entity names', async () => {
    await insertOnce(dataSource.getRepository(PathTicket), { code: 'P1' }, () => ({ code: 'P1' }));
    const inTransaction = dataSource.transaction((manager) => insertOnce(manager.getRepository(PathTicket), { code: 'P1' }, () => ({ code: 'P1' })));
    // Observed before: created true, then the COMMIT failed.
    await expect(inTransaction).rejects.toThrow(/uq_path_tickets_code is DEFERRABLE INITIALLY DEFERRED/);
  });
});

/** A partial unique index: one live coupon per ref; cancelled ones keep theirs. */
@Entity({ name: 'coupons' })
@Index('uq_coupons_ref_live', ['ref'], { unique: true, where: `"status" <> 'CANCELLED'` })
class Coupon {
  @PrimaryGeneratedColumn()
  id!: number;

  @Column({ type: 'varchar', length: 64 })
  ref!: string;

  @Column({ type: 'varchar', length: 16, default: 'LIVE' })
  status!: string;
}

/** A unique key with a nullable part, NULLS NOT DISTINCT (made below: one code per tenant, and one without). */
@Entity({ name: 'seats' })
class Seat {
  @PrimaryGeneratedColumn()
  id!: number;

  @Column({ name: 'tenant_id', type: 'integer', nullable: true })
  tenantId!: number | null;

  @Column({ type: 'varchar', length: 64 })
  code!: string;
}

/** A unique jsonb value: a null inside it is a JSON null, not SQL's. */
@Entity({ name: 'profiles' })
@Index('uq_profiles_meta', ['meta'], { unique: true })
class Profile {
  @PrimaryGeneratedColumn()
  id!: number;

  @Column({ type: 'jsonb' })
  meta!: Record<string, unknown>;
}

// An adversarial helper: a findExisting that matched more rows than the violated key protects
// (a partial index's other rows; a null part TypeORM's 'ignore' drops) gave every caller
// another row than the one that refused the insert, silently.
describe('insertOnce: the existing row is the one the key protects', () => {
  const schema = testSchemaName();
  let dataSource: DataSource;
  let ignoring: DataSource;
  beforeAll(async () => {
    dataSource = await openSchemaDataSource(schema, { entities: [Coupon, Seat, Profile], extra: { max: 12 }, synchronize: true });
    await dataSource.query(`CREATE UNIQUE INDEX uq_seats_tenant_code ON "${schema}".seats (tenant_id, code) NULLS NOT DISTINCT`);
    ignoring = new DataSource({ ...dataSource.options, synchronize: false, invalidWhereValuesBehavior: { null: 'ignore' } } as typeof dataSource.options);
    await ignoring.initialize();
  });
  afterAll(async () => {
    await ignoring?.destroy();
    await dropSchemaDataSource(dataSource);
  });

  it('refuses a findExisting that matches other rows too (a partial unique index): never another row', async () => {
    const coupons = dataSource.getRepository(Coupon);
    const cancelled = await coupons.save(coupons.create({ ref: 'C-1', status: 'CANCELLED' }));
    const results = await Promise.allSettled(
      Array.from({ length: 10 }, () => insertOnce(coupons, { ref: 'C-1' }, () => ({ ref: 'C-1' }))),
    );
    const created = results.filter((r) => r.status === 'fulfilled' && r.value.created);
    expect(created).toHaveLength(1);
    const others = results.filter((r) => !(r.status === 'fulfilled' && r.value.created));
    expect(others).toHaveLength(9);
    for (const other of others) {
      // Observed before: fulfilled, created false, with the cancelled row.
      expect(other.status === 'fulfilled' ? other.value.entity : undefined).toBeUndefined();
      expect(other.status === 'rejected' && String(other.reason)).toMatch(
        /insertOnce: findExisting matched more than one row of .*coupons.* \(uq_coupons_ref_live refused the insert\)/,
      );
    }
    expect(cancelled.id).toBeDefined();
    // Narrowed to the key's rows, it finds the live one.
    const narrowed = await insertOnce(coupons, { ref: 'C-1' }, () => ({ ref: 'C-1', status: 'LIVE' }));
    expect(narrowed).toMatchObject({ created: false, entity: { ref: 'C-1', status: 'LIVE' } });
  });

  it("finds a null part of the key as IS NULL, whatever the DataSource's invalidWhereValuesBehavior", async () => {
    for (const source of [dataSource, ignoring]) {
      const code = `S-${randomUUID().slice(0, 8)}`;
      const seats = source.getRepository(Seat);
      await seats.insert({ tenantId: 5, code });
      // TypeORM's types take no null in a where (IsNull() is theirs); JavaScript callers give one.
      const nullTenant = () => ({ tenantId: null, code }) as unknown as FindOptionsWhere<Seat>;
      const first = await insertOnce(seats, { tenantId: null, code }, nullTenant);
      expect(first).toMatchObject({ created: true, entity: { tenantId: null, code } });
      // Observed before: TypeORM's refusal of null (its default), or tenant 5's row ('ignore').
      const again = await insertOnce(seats, { tenantId: null, code }, nullTenant);
      expect(again).toMatchObject({ created: false, entity: { id: first.entity.id, tenantId: null, code } });
    }
  });

  // The same helper, on the change above: a null inside a jsonb value was made IS NULL too, and
  // the duplicate's violation was rethrown (the row not found).
  it('leaves a null inside a value alone (a jsonb column): only a column given null is IS NULL', async () => {
    const profiles = dataSource.getRepository(Profile);
    const meta = { ref: randomUUID(), a: null };
    const first = await insertOnce(profiles, { meta }, () => ({ meta }));
    expect(first.created).toBe(true);
    expect(await insertOnce(profiles, { meta }, () => ({ meta }))).toMatchObject({ created: false, entity: { id: first.entity.id } });
  });
});
