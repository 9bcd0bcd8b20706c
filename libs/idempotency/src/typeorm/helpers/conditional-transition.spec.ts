import { afterAll, beforeAll, describe, expect, it } from '@jest/globals';
import { randomUUID } from 'node:crypto';
import type { Pool } from 'pg';
import {
  Column,
  DataSource,
  DeleteDateColumn,
  Entity,
  EventSubscriber,
  In,
  PrimaryGeneratedColumn,
  type EntitySubscriberInterface,
  type FindOptionsWhere,
  type Repository,
  type UpdateEvent,
} from 'typeorm';
import { transition } from './conditional-transition.js';
import { insertOnce } from './insert-once.js';
import { dropSchemaDataSource, openSchemaDataSource, testSchemaName } from '../../../../../test/support/test-schema.js';

/** An embedded column group: `where: { channel: {} }` names none of its columns. */
class Channel {
  @Column({ type: 'varchar', length: 16, nullable: true })
  name!: string | null;
}

@Entity({ name: 'payments' })
class Payment {
  @Column(() => Channel)
  channel!: Channel;

  /** Soft delete: TypeORM adds its own condition on it to every SELECT, none to an UPDATE. */
  @DeleteDateColumn({ name: 'deleted_at', type: 'timestamptz', nullable: true })
  deletedAt!: Date | null;

  @Column({ type: 'jsonb', nullable: true })
  tags!: Record<string, unknown> | null;

  @PrimaryGeneratedColumn('uuid')
  id!: string;

  @Column({ type: 'varchar', length: 16, default: 'PENDING' })
  status!: string;

  @Column({ name: 'transaction_id', type: 'varchar', length: 64, nullable: true })
  transactionId!: string | null;

  @Column({ name: 'paid_at', type: 'timestamptz', nullable: true })
  paidAt!: Date | null;

  @Column({ type: 'integer', default: 1 })
  version!: number;
}

enum ShipmentState {
  Packed = 'PACKED',
  Shipped = 'SHIPPED',
}

/** A PostgreSQL enum state: a state it does not know failed as a raw driver error (22P02). */
@Entity({ name: 'shipments' })
class Shipment {
  @PrimaryGeneratedColumn('uuid')
  id!: string;

  @Column({ type: 'enum', enum: ShipmentState, enumName: 'shipment_state', default: ShipmentState.Packed })
  status!: ShipmentState;

  @Column({ type: 'integer', default: 1 })
  version!: number;
}

/** A fixed-width state column: PostgreSQL pads what it stores ('CLOSED' reads 'CLOSED    '). */
@Entity({ name: 'tickets' })
class Ticket {
  @PrimaryGeneratedColumn('uuid')
  id!: string;

  @Column({ type: 'char', length: 10, nullable: true })
  status!: string | null;

  @Column({ type: 'integer', default: 1 })
  version!: number;
}

/** A state column under a transformer: 'PENDING' in JavaScript, 'pending' in the database. */
@Entity({ name: 'refunds' })
class Refund {
  @PrimaryGeneratedColumn('uuid')
  id!: string;

  @Column({
    type: 'varchar',
    length: 16,
    default: 'pending',
    transformer: { to: (state?: string) => state?.toLowerCase(), from: (stored: string | null) => stored?.toUpperCase() ?? null },
  })
  status!: string;

  @Column({ type: 'integer', default: 1 })
  version!: number;
}

/** The state and the version in an embedded column group (`lifecycle.status`, `lifecycle.version`). */
class Lifecycle {
  @Column({ type: 'varchar', length: 16, default: 'PENDING' })
  status!: string;

  @Column({ type: 'integer', default: 1 })
  version!: number;

  @Column({ type: 'varchar', length: 16, nullable: true })
  note!: string | null;
}

@Entity({ name: 'invoices' })
class Invoice {
  @PrimaryGeneratedColumn('uuid')
  id!: string;

  @Column(() => Lifecycle)
  lifecycle!: Lifecycle;

  @Column({ name: 'paid_by', type: 'varchar', length: 16, nullable: true })
  paidBy!: string | null;
}

/** A row an update subscriber writes with insertOnce, from inside transition's UPDATE. */
@Entity({ name: 'payment_audits' })
class PaymentAudit {
  @PrimaryGeneratedColumn('uuid')
  id!: string;

  @Column({ name: 'payment_id', type: 'uuid', unique: true })
  paymentId!: string;
}

@EventSubscriber()
class PaymentAuditor implements EntitySubscriberInterface<Payment> {
  listenTo() {
    return Payment;
  }
  async afterUpdate(event: UpdateEvent<Payment>) {
    // A query builder's UPDATE hands its subscribers the values it sets.
    const paymentId = (event.entity as Partial<Payment> | undefined)?.transactionId;
    if (paymentId) await insertOnce(event.manager.getRepository(PaymentAudit), { paymentId }, () => ({ paymentId }));
  }
}

describe('transition (PostgreSQL)', () => {
  const schema = testSchemaName();
  let dataSource: DataSource;
  let payments: Repository<Payment>;
  const newPayment = async (status = 'PENDING') => (await payments.save(payments.create({ status }))).id;
  const pay = (id: string, transactionId: string, paidAt = new Date()) =>
    transition(payments, { where: { id }, from: ['PENDING'], to: 'PAID', set: { transactionId, paidAt } });

  beforeAll(async () => {
    dataSource = await openSchemaDataSource(schema, {
      entities: [Payment, Shipment, Ticket, Refund, Invoice],
      extra: { max: 30 },
      synchronize: true,
    });
    payments = dataSource.getRepository(Payment);
  });
  afterAll(async () => {
    await dropSchemaDataSource(dataSource);
  });

  it('lets exactly one of 20 concurrent PENDING→PAID transitions change the row', async () => {
    const id = await newPayment();
    const results = await Promise.all(Array.from({ length: 20 }, (_, i) => pay(id, `tx-${i}`)));
    expect((dataSource.driver as unknown as { master: Pool }).master.totalCount).toBeGreaterThanOrEqual(10);

    const winners = results.filter((r) => r.changed);
    expect(winners).toHaveLength(1);
    expect(results.filter((r) => !r.changed && r.reason === 'already_done')).toHaveLength(19);
    const winner = winners[0].changed ? winners[0].entity : undefined;
    // The row as the winning statement left it, straight from RETURNING.
    expect(winner).toBeInstanceOf(Payment);
    expect(winner).toMatchObject({ id, status: 'PAID', version: 2 });
    expect(winner!.paidAt).toBeInstanceOf(Date);

    const row = await payments.findOneByOrFail({ id });
    expect(row).toMatchObject({ status: 'PAID', transactionId: winner!.transactionId, version: 2 });
  });

  it('never overwrites what the first transition set: a repeat is already_done', async () => {
    const id = await newPayment();
    const firstPaidAt = new Date('2026-01-01T10:00:00.000Z');
    expect(await pay(id, 'tx-first', firstPaidAt)).toMatchObject({ changed: true });
    const repeat = await pay(id, 'tx-second', new Date('2026-01-02T10:00:00.000Z'));
    expect(repeat).toMatchObject({
      changed: false,
      reason: 'already_done',
      entity: { transactionId: 'tx-first', paidAt: firstPaidAt, version: 2 },
    });
    expect(await payments.findOneByOrFail({ id })).toMatchObject({
      status: 'PAID',
      transactionId: 'tx-first',
      paidAt: firstPaidAt,
      version: 2,
    });
  });

  it('refuses a state outside `from` as not_allowed, and changes nothing', async () => {
    const id = await newPayment('CANCELLED');
    expect(await pay(id, 'tx-late')).toMatchObject({ changed: false, reason: 'not_allowed', entity: { status: 'CANCELLED' } });
    expect(await payments.findOneByOrFail({ id })).toMatchObject({ status: 'CANCELLED', transactionId: null, version: 1 });
  });

  it('refuses a stale expectedVersion as version_conflict, and takes the current one', async () => {
    const id = await newPayment();
    await payments.update({ id }, { version: 5 });
    const spec = { where: { id }, from: ['PENDING'], to: 'PAID', set: { transactionId: 'tx-v' } } as const;
    const stale = await transition(payments, { ...spec, expectedVersion: 4 });
    expect(stale).toMatchObject({ changed: false, reason: 'version_conflict', entity: { status: 'PENDING', version: 5 } });
    expect(await transition(payments, { ...spec, expectedVersion: 5 })).toMatchObject({
      changed: true,
      entity: { status: 'PAID', transactionId: 'tx-v', version: 6 },
    });
  });

  // An adversarial helper: a PAID→SHIPPED call whose UPDATE ran while the row was still PENDING
  // and whose read found it PAID answered version_conflict, though it gave no version (6 of 50).
  it('never answers version_conflict without an expectedVersion: a row moved into `from` meanwhile is tried again', async () => {
    const reasons: string[] = [];
    for (let round = 0; round < 4; round++) {
      const id = await newPayment();
      const move = (from: string, to: string, i: number) =>
        dataSource.transaction((manager) =>
          transition(manager.getRepository(Payment), { where: { id }, from: [from], to, set: { transactionId: `tx-${round}-${i}` } }),
        );
      const results = await Promise.all(Array.from({ length: 24 }, (_, i) => (i % 2 ? move('PAID', 'SHIPPED', i) : move('PENDING', 'PAID', i))));
      reasons.push(...results.map((result) => (result.changed ? 'changed' : result.reason)));
      expect(results.filter((result) => result.changed).length).toBeGreaterThanOrEqual(1);
    }
    expect(reasons.filter((reason) => reason === 'version_conflict')).toEqual([]);
  });

  it('refuses an expectedVersion that is not an integer before any statement (the database refused it: a 500)', async () => {
    const id = await newPayment();
    for (const expectedVersion of [Number.NaN, 1.5, '2' as unknown as number, Infinity]) {
      const error = await transition(payments, { where: { id }, from: ['PENDING'], to: 'PAID', expectedVersion }).catch((e: unknown) => e);
      expect(error).toBeInstanceOf(RangeError);
      expect((error as Error).message).toMatch(/expectedVersion.*integer/);
    }
    expect(await payments.findOneByOrFail({ id })).toMatchObject({ status: 'PENDING', version: 1 });
    // null is no version (JavaScript's `ifMatch ?? null`), as undefined.
    expect(await transition(payments, { where: { id }, from: ['PENDING'], to: 'PAID', expectedVersion: null as unknown as number })).toMatchObject({ changed: true });
  });

  // An adversarial helper: `where: { id: NaN }` (a parsed bad id) reached PostgreSQL (22P02, a 500).
  // helper-238: an integer past 2^53 (a bigint business number sent as a JSON number) names the
  // row of another number the parse rounded to: the payment of order ...037 paid order ...000.
  it('refuses a where holding NaN, an infinity or an integer past 2^53 before any statement', async () => {
    for (const where of [{ version: Number.NaN }, { version: Infinity }, [{ version: -Infinity }], { version: 1234567890123456037 }]) {
      const error = await transition(payments, { where: where as never, from: ['PENDING'], to: 'PAID' }).catch((e: unknown) => e);
      expect(error).toBeInstanceOf(RangeError);
      expect((error as Error).message).toMatch(/where.*NaN, an infinity or an integer past 2\^53/);
    }
  });

  it('reports an unknown row as not_found', async () => {
    expect(await pay(randomUUID(), 'tx-none')).toEqual({ changed: false, reason: 'not_found' });
  });

  it('works without a version column, and inside a transaction that rolls back', async () => {
    const id = await newPayment();
    await dataSource
      .transaction(async (manager) => {
        const inside = await transition(manager.getRepository(Payment), {
          where: { id },
          from: ['PENDING'],
          to: 'CANCELLED',
          versionProperty: false,
        });
        expect(inside).toMatchObject({ changed: true, entity: { status: 'CANCELLED', version: 1 } });
        throw new Error('roll back');
      })
      .catch(() => undefined);
    expect(await payments.findOneByOrFail({ id })).toMatchObject({ status: 'PENDING', version: 1 });
  });

  it('refuses a spec whose `from` includes `to` (a repeat would apply again)', async () => {
    const id = await newPayment();
    await expect(transition(payments, { where: { id }, from: ['PENDING', 'PAID'], to: 'PAID' })).rejects.toThrow(RangeError);
  });

  // TypeORM's update builder takes an empty `where` for no condition at all: every PENDING row
  // moved (found by an adversarial helper). TypeORM's own repo.update({}) refuses it too.
  it.each([
    ['{}', {}],
    ['[]', []],
    ['{ id: undefined }', { id: undefined }],
    // Round 3 of the adversaries: a nested empty object (an embedded column group's; a relation's alike).
    ['{ channel: {} }', { channel: {} }],
    ['[{ channel: {} }]', [{ channel: {} }]],
    // Round 5: a Date (an array, a Buffer) given for an embedded column group names none of it.
    ['{ channel: new Date() }', { channel: new Date() }],
    // Round 6: an element naming no row ORed with one that does.
    ['[{}, { id }]', [{}, { id: '00000000-0000-4000-8000-000000000000' }]],
  ])('refuses a `where` that names no row (%s) and changes nothing', async (_name, where) => {
    const ids = [await newPayment(), await newPayment()];
    // Refused by transition, or by TypeORM itself (an undefined value, under its default).
    await expect(transition(payments, { where: where as { id: string }, from: ['PENDING'], to: 'PAID' })).rejects.toThrow(
      /`where` names no row|Undefined value encountered/,
    );
    for (const id of ids) expect(await payments.findOneByOrFail({ id })).toMatchObject({ status: 'PENDING', version: 1 });
  });

  // Round 4 of the adversaries: the check above refused an entity (a class instance) as `where`,
  // which TypeORM takes; operators and nested values that name a column are conditions too.
  it('takes an entity, an operator and a nested value as a `where` that names a row', async () => {
    const id = await newPayment();
    const other = await newPayment();
    const entity = Object.assign(new Payment(), { id });
    expect(await transition(payments, { where: entity as FindOptionsWhere<Payment>, from: ['PENDING'], to: 'PAID' })).toMatchObject({ changed: true });
    expect(await transition(payments, { where: { id: In([id]) }, from: ['PAID'], to: 'SETTLED' })).toMatchObject({ changed: true });
    await payments.update({ id }, { channel: { name: 'web' } });
    expect(await transition(payments, { where: { id, channel: { name: 'web' } }, from: ['SETTLED'], to: 'CLOSED' })).toMatchObject({ changed: true });
    expect(await payments.findOneByOrFail({ id: other })).toMatchObject({ status: 'PENDING', version: 1 });
    // Round 5: an empty object is a value of a jsonb column (TypeORM compares it), not "no row".
    const tagged = await newPayment();
    await payments.update({ id: tagged }, { tags: {} });
    expect(await transition(payments, { where: { tags: {} }, from: ['PENDING'], to: 'PAID' })).toMatchObject({ changed: true, entity: { id: tagged } });
    expect(await payments.findOneByOrFail({ id: other })).toMatchObject({ status: 'PENDING', version: 1 });
  });

  // Session 14's adversaries: TypeORM's UPDATE adds no soft-delete condition, so a soft-deleted
  // row was moved (changed: true), while TypeORM's finds, and transition's own read after a
  // refusal, take it for absent.
  it('takes a soft-deleted row for absent: not_found, and nothing changes', async () => {
    const id = await newPayment();
    await payments.softDelete({ id });
    expect(await pay(id, 'tx-deleted')).toEqual({ changed: false, reason: 'not_found' });
    const row = await payments.findOneOrFail({ where: { id }, withDeleted: true });
    expect(row).toMatchObject({ status: 'PENDING', transactionId: null, version: 1 });
    await payments.restore({ id });
    expect(await pay(id, 'tx-restored')).toMatchObject({ changed: true, entity: { status: 'PAID', transactionId: 'tx-restored' } });
  });

  // Session 22's adversaries: a state the column's enum does not know failed as PostgreSQL's
  // 22P02 (a QueryFailedError), not as transition's own refusal naming the states it knows.
  it.each([
    ['to', { from: [ShipmentState.Packed], to: 'DELIVERED' }],
    ['from', { from: ['LOST', ShipmentState.Packed], to: ShipmentState.Shipped }],
  ])('refuses a state the enum column does not know (in `%s`), naming the states it knows, and changes nothing', async (_name, states) => {
    const shipments = dataSource.getRepository(Shipment);
    const { id } = await shipments.save(shipments.create({}));
    await expect(transition(shipments, { where: { id }, ...(states as { from: string[]; to: string }) })).rejects.toThrow(
      /Shipment\.status has no state "(DELIVERED|LOST)" \(its states: PACKED, SHIPPED\)/,
    );
    expect(await shipments.findOneByOrFail({ id })).toMatchObject({ status: 'PACKED', version: 1 });
    expect(await transition(shipments, { where: { id }, from: [ShipmentState.Packed], to: ShipmentState.Shipped })).toMatchObject({
      changed: true,
      entity: { status: 'SHIPPED', version: 2 },
    });
  });

  // An adversarial helper: the repeat of a transition on a char(10) column was not_allowed (the
  // row read back padded), and `from: [null]` could never apply (SQL's IN (NULL) matches no row)
  // and said version_conflict.
  it('answers a repeat already_done on a fixed-width (char) state column', async () => {
    const tickets = dataSource.getRepository(Ticket);
    const { id } = await tickets.save(tickets.create({ status: 'OPEN' }));
    expect(await transition(tickets, { where: { id }, from: ['OPEN'], to: 'CLOSED' })).toMatchObject({ changed: true });
    expect(await transition(tickets, { where: { id }, from: ['OPEN'], to: 'CLOSED' })).toMatchObject({ changed: false, reason: 'already_done' });
    expect(await transition(tickets, { where: { id }, from: ['NEW'], to: 'OPEN' })).toMatchObject({ changed: false, reason: 'not_allowed' });
  });

  it('refuses null in `from`: no row is ever IN (NULL)', async () => {
    const tickets = dataSource.getRepository(Ticket);
    const { id } = await tickets.save(tickets.create({ status: null }));
    await expect(transition(tickets, { where: { id }, from: [null as unknown as string], to: 'OPEN' })).rejects.toThrow(
      'transition: `from` holds null, which no row is IN; give the state a value (a NOT NULL column with a default)',
    );
  });

  // An adversarial helper: `from` went to the database as given while `to` went through the
  // column's transformer, so IN ('PENDING') never matched the stored 'pending', and 30 of 30
  // parallel calls answered version_conflict, the row never moved.
  it("compares `from` as the column's transformer stores it: one of 20 parallel calls moves the row", async () => {
    const refunds = dataSource.getRepository(Refund);
    const { id } = await refunds.save(refunds.create({}));
    const results = await Promise.all(Array.from({ length: 20 }, () => transition(refunds, { where: { id }, from: ['PENDING'], to: 'REFUNDED' })));
    const stored = await dataSource.query(`SELECT status, version FROM "${schema}"."refunds" WHERE id = $1`, [id]);
    expect({
      changed: results.filter((result) => result.changed).length,
      alreadyDone: results.filter((result) => !result.changed && result.reason === 'already_done').length,
      stored,
    }).toEqual({ changed: 1, alreadyDone: 19, stored: [{ status: 'refunded', version: 2 }] });
    expect(await transition(refunds, { where: { id }, from: ['NEW'], to: 'PENDING' })).toMatchObject({ changed: false, reason: 'not_allowed' });
  });

  // An adversarial helper: `statusProperty: 'lifecycle.status'` was set as a property named
  // 'lifecycle.status', which TypeORM wrote as NULL (and the version as NULL), answering changed.
  it('moves a state and a version kept in an embedded column group, once among 20 parallel calls', async () => {
    const invoices = dataSource.getRepository(Invoice);
    const { id } = await invoices.save(invoices.create({ lifecycle: { note: 'kept' } }));
    const results = await Promise.all(
      Array.from({ length: 20 }, (_, i) =>
        transition(invoices, {
          where: { id },
          from: ['PENDING'],
          to: 'PAID',
          set: { paidBy: `u${i}`, lifecycle: { note: `by u${i}` } },
          statusProperty: 'lifecycle.status',
          versionProperty: 'lifecycle.version',
        }),
      ),
    );
    const winner = results.find((result) => result.changed);
    const stored = await dataSource.query(
      `SELECT "lifecycleStatus" AS status, "lifecycleVersion" AS version, "lifecycleNote" AS note, paid_by FROM "${schema}"."invoices" WHERE id = $1`,
      [id],
    );
    expect({
      changed: results.filter((result) => result.changed).length,
      alreadyDone: results.filter((result) => !result.changed && result.reason === 'already_done').length,
      winner: winner?.entity.lifecycle,
    }).toEqual({ changed: 1, alreadyDone: 19, winner: { status: 'PAID', version: 2, note: `by ${winner?.entity.paidBy}` } });
    expect(stored).toEqual([{ status: 'PAID', version: 2, note: `by ${winner?.entity.paidBy}`, paid_by: winner?.entity.paidBy }]);
  });

  // An adversarial helper (helper-198): beside insertOnce on one transaction (Promise.all over one
  // manager), the UPDATE went out inside insertOnce's savepoint, which its duplicate rolled back:
  // transition answered changed, the transaction committed, and the row had not moved (20 of 20).
  it.each(['insertOnce first', 'transition first'])('moves the row beside an insertOnce duplicate on one transaction (%s)', async (order) => {
    for (let trial = 0; trial < 10; trial++) {
      const id = await newPayment();
      const results = await dataSource.transaction(async (manager) => {
        const repo = manager.getRepository(Payment);
        const insert = () => insertOnce(repo, { id, status: 'PENDING' }, () => ({ id }));
        const move = () => transition(repo, { where: { id }, from: ['PENDING'], to: 'PAID' });
        if (order === 'insertOnce first') {
          const [inserted, moved] = await Promise.all([insert(), move()]);
          return { created: inserted.created, changed: moved.changed };
        }
        const [moved, inserted] = await Promise.all([move(), insert()]);
        return { created: inserted.created, changed: moved.changed };
      });
      const row = await payments.findOneByOrFail({ id });
      expect({ ...results, status: row.status, version: row.version }).toEqual({ created: false, changed: true, status: 'PAID', version: 2 });
    }
  });

  // Taking its turn, a transition whose UPDATE runs a subscriber that calls insertOnce on the same
  // transaction lets that call run inside its own turn (waiting for the transaction's turn, it
  // would wait for the transition that waits on it, and the transaction would hang).
  it('lets a subscriber of its UPDATE call insertOnce on the same transaction, beside another insertOnce', async () => {
    const audited = await openSchemaDataSource(testSchemaName(), { entities: [Payment, PaymentAudit], subscribers: [PaymentAuditor], synchronize: true });
    try {
      const repo = audited.getRepository(Payment);
      const { id } = await repo.save(repo.create({ status: 'PENDING' }));
      const results = await audited.transaction(async (manager) => {
        const inTransaction = manager.getRepository(Payment);
        const [moved, inserted] = await Promise.all([
          transition(inTransaction, { where: { id }, from: ['PENDING'], to: 'PAID', set: { transactionId: id } }),
          insertOnce(inTransaction, { id, status: 'PENDING' }, () => ({ id })),
        ]);
        return { changed: moved.changed, created: inserted.created };
      });
      const audits = await audited.getRepository(PaymentAudit).countBy({ paymentId: id });
      expect({ ...results, status: (await repo.findOneByOrFail({ id })).status, audits }).toEqual({ changed: true, created: false, status: 'PAID', audits: 1 });
    } finally {
      await dropSchemaDataSource(audited);
    }
  });

  // helper-201: a PL/pgSQL block earlier in the transaction (its `END;` inside $$ ... $$) was read
  // as the transaction ending, and every helper call after it refused ("the transaction ended
  // before this call had its turn"), the row left PENDING, the transaction healthy.
  it.each([
    "DO $$ BEGIN PERFORM pg_advisory_xact_lock(42); END; $$",
    "DO $body$ BEGIN IF true THEN PERFORM 1; END IF; END; $body$",
    "SELECT 'end; commit' AS text -- rollback; end",
  ])('is not refused after a statement that only mentions an end of transaction: %s', async (statement) => {
    const id = await newPayment();
    const other = await newPayment();
    const result = await dataSource.transaction(async (manager) => {
      const repo = manager.getRepository(Payment);
      // A helper call first: the statement watcher is on from then.
      await transition(repo, { where: { id: other }, from: ['PENDING'], to: 'PAID' });
      await manager.query(statement);
      return transition(repo, { where: { id }, from: ['PENDING'], to: 'PAID' });
    });
    expect([result.changed, (await payments.findOneByOrFail({ id })).status]).toEqual([true, 'PAID']);
  });
});
