import { afterAll, beforeAll, describe, expect, it, jest } from '@jest/globals';
import { Logger } from '@nestjs/common';
import { Exclude, Expose, instanceToPlain } from 'class-transformer';
import { AsyncResource } from 'node:async_hooks';
import { randomUUID } from 'node:crypto';
import type { Pool } from 'pg';
import { Column, DataSource, Entity, PrimaryGeneratedColumn, type DataSourceOptions, type EntityManager } from 'typeorm';
import { IdempotencyConfigError, IdempotencyError, IdempotencyKeyError, IdempotencyStoreError } from '../../index.js';
import { IDEMPOTENCY_ENTITIES } from '../entities.js';
import { IDEMPOTENCY_MIGRATIONS } from '../migrations.js';
import { PostgresIdempotencyStore } from '../store/postgres-idempotency.store.js';
import { recordKey } from '../store/record-key.js';
import { uniqueViolationOf } from '../helpers/unique-violation.js';
import { IdempotentTransactions } from './idempotent-transactions.js';
import { dropSchemaDataSource, openSchemaDataSource, testSchemaName } from '../../../../../test/support/test-schema.js';

/** The business effect; deliberately without a unique key, so that a second run shows as a second row. */
@Entity({ name: 'payments' })
class Payment {
  @PrimaryGeneratedColumn()
  id!: number;

  @Column({ name: 'op_key', type: 'varchar', length: 4000 })
  opKey!: string;

  @Column({ type: 'integer' })
  amount!: number;

  @Column({ name: 'created_at', type: 'timestamptz', default: () => 'now()' })
  createdAt!: Date;
}

/** An account as the app's global ClassSerializerInterceptor sends it: never its password hash. */
class AccountView {
  id!: number;
  email!: string;
  @Exclude()
  passwordHash!: string;

  constructor(fields: AccountView) {
    Object.assign(this, fields);
  }
}

/** A promise the test opens when it chooses: holds a transaction open at a known point. */
function gate() {
  let open!: () => void;
  const opened = new Promise<void>((resolve) => (open = resolve));
  return { open, opened };
}

describe('IdempotentTransactions (PostgreSQL)', () => {
  const schema = testSchemaName();
  let dataSource: DataSource;
  let transactions: IdempotentTransactions;
  const sql = (text: string, params: unknown[] = []) => dataSource.query(text, params);
  const records = `"${schema}".idempotency_records`;
  const payments = async (opKey: string) => dataSource.getRepository(Payment).countBy({ opKey });
  const record = async (key: string) => (await sql(`SELECT * FROM ${records} WHERE key = $1`, [recordKey(key)]))[0];
  const expire = (key: string) => sql(`UPDATE ${records} SET expires_at = now() - interval '1 second' WHERE key = $1`, [recordKey(key)]);
  /** Statements of this schema waiting for a lock: a duplicate queued on the first transaction's row. */
  const waitingOnLock = async (marker: string) =>
    (await sql(`SELECT count(*)::int AS n FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND query LIKE $1 AND query LIKE $2`, [
      `%${marker}%`,
      `%"${schema}"%`,
    ]))[0].n as number;
  /** Polls a state of the database (not a timer) for up to two seconds. */
  const until = async (condition: () => Promise<boolean>) => {
    for (let i = 0; i < 400; i++) {
      if (await condition()) return;
      await new Promise((resolve) => setTimeout(resolve, 5));
    }
    throw new Error('condition not reached in 2 s');
  };
  const pay = (opKey: string, amount = 10) => async (manager: EntityManager) => {
    const payment = await manager.save(Payment, { opKey, amount });
    return { statusCode: 201, body: payment };
  };

  beforeAll(async () => {
    dataSource = await openSchemaDataSource(schema, {
      entities: [...IDEMPOTENCY_ENTITIES, Payment],
      migrations: IDEMPOTENCY_MIGRATIONS,
      migrationsRun: true,
      extra: { max: 20 },
    });
    await sql(`CREATE TABLE "${schema}".payments (id serial PRIMARY KEY, op_key varchar(4000) NOT NULL, amount integer NOT NULL,
      created_at timestamptz NOT NULL DEFAULT now())`);
    transactions = new IdempotentTransactions(dataSource);
  });
  afterAll(async () => {
    await dropSchemaDataSource(dataSource);
  });

  it('runs the work once, in a transaction, and replays its answer (as JSON) without running it again', async () => {
    const key = `pay:${randomUUID()}`;
    let runs = 0;
    const work = async (manager: EntityManager) => {
      runs++;
      expect(manager.queryRunner?.isTransactionActive).toBe(true);
      return pay(key, 42)(manager);
    };
    const first = await transactions.run({ key, fingerprint: 'fp' }, work);
    expect(first).toEqual({ status: 'ran', statusCode: 201, body: { id: expect.any(Number), opKey: key, amount: 42, createdAt: expect.any(String) } });
    const again = await transactions.run({ key, fingerprint: 'fp' }, work);
    expect(again).toEqual({ ...first, status: 'replayed' });
    expect(runs).toBe(1);
    expect(await payments(key)).toBe(1);
    expect(await record(key)).toMatchObject({ state: 'completed', status_code: 201, has_body: true, fingerprint: 'fp' });
  });

  it('counts the retention from the save, not from the transaction\'s start: a retry right after a run longer than it replays', async () => {
    const key = `slow:${randomUUID()}`;
    const short = new IdempotentTransactions(dataSource, { retentionMs: 1_000 });
    const work = async (manager: EntityManager) => {
      await manager.query('SELECT pg_sleep(1.3)');
      return pay(key)(manager);
    };
    const first = await short.run({ key, fingerprint: 'fp' }, work);
    const again = await short.run({ key, fingerprint: 'fp' }, work);
    // Observed before: ran, ran, 2 payments (the answer committed already expired).
    expect({ statuses: [first.status, again.status], payments: await payments(key) }).toEqual({ statuses: ['ran', 'replayed'], payments: 1 });
  });

  // The record commits before Nest's ClassSerializerInterceptor sees the body: JSON.stringify
  // sent, replayed and saved an @Exclude()d password hash (an adversarial helper).
  it("answers, replays and saves the body as class-transformer makes it (@Exclude() holds); serialize gives the app's own options", async () => {
    const key = `account:${randomUUID()}`;
    const work = async () => ({ statusCode: 201, body: new AccountView({ id: 7, email: 'a@b', passwordHash: 'bcrypt$SECRET' }) });
    const first = await transactions.run({ key }, work);
    const again = await transactions.run({ key }, work);
    // Observed before: the hash in the answer, the replay and the record.
    expect({ first: first.status === 'ran' && first.body, again: again.status === 'replayed' && again.body, saved: (await record(key)).body }).toEqual({
      first: { id: 7, email: 'a@b' },
      again: { id: 7, email: 'a@b' },
      saved: JSON.stringify({ id: 7, email: 'a@b' }),
    });
    class Exposed {
      @Expose() id = 8;
      email = 'c@d';
    }
    const exposing = new IdempotentTransactions(dataSource, { serialize: (body) => instanceToPlain(body, { excludeExtraneousValues: true }) });
    const only = await exposing.run({ key: `exposed:${randomUUID()}` }, async () => ({ body: new Exposed() }));
    expect(only.status === 'ran' && only.body).toEqual({ id: 8 });
    expect(() => new IdempotentTransactions(dataSource, { serialize: 'instanceToPlain' as never })).toThrow(IdempotencyConfigError);
  });

  // A first version took every body apart through instanceToPlain: what a toJSON hid was sent,
  // replayed and saved, and a URL became {} (the review, a helper).
  it('honours a toJSON of the body and of what it holds; keeps of a nested entity what class-transformer keeps', async () => {
    class Money {
      constructor(
        readonly cents: number,
        readonly ledgerSecret: string,
      ) {}
      toJSON() {
        return `${(this.cents / 100).toFixed(2)} EUR`;
      }
    }
    class Order {
      id = 1;
      total = new Money(1250, 'LEDGER-7731');
      link = new URL('https://shop.example/o/1');
      owner = new AccountView({ id: 7, email: 'a@b', passwordHash: 'bcrypt$SECRET' });
      placedAt = new Date('2026-01-02T03:04:05.000Z');
    }
    const key = `order:${randomUUID()}`;
    const first = await transactions.run({ key }, async () => ({ body: new Order() }));
    const expected = { id: 1, total: '12.50 EUR', link: 'https://shop.example/o/1', owner: { id: 7, email: 'a@b' }, placedAt: '2026-01-02T03:04:05.000Z' };
    expect({ first: first.status === 'ran' && first.body, saved: JSON.parse((await record(key)).body) }).toEqual({ first: expected, saved: expected });
    const secretive = { toJSON: () => ({ shown: true }), hidden: 'no' };
    const own = await transactions.run({ key: `own:${randomUUID()}` }, async () => ({ body: secretive }));
    expect(own.status === 'ran' && own.body).toEqual({ shown: true });
    await expect(transactions.run({ key: `async:${randomUUID()}` }, async () => ({ body: 1 })).then(() =>
      new IdempotentTransactions(dataSource, { serialize: async () => ({}) }).run({ key: `async:${randomUUID()}` }, async () => ({ body: 1 })),
    )).rejects.toThrow(/serialize returned a promise/);
  });

  // An adversarial helper: a Set, in a class instance or a plain object, was sent, saved and
  // replayed as {"0":"vip","1":"eu"}; ClassSerializerInterceptor sends ["vip","eu"].
  it('answers a Set as class-transformer makes it: an array', async () => {
    class Customer {
      id = 7;
      tags = new Set(['vip', 'eu']);
    }
    const key = `set:${randomUUID()}`;
    const first = await transactions.run({ key }, async () => ({ body: { customer: new Customer(), tags: new Set(['a']) } }));
    const expected = instanceToPlain({ customer: new Customer(), tags: new Set(['a']) });
    expect(expected).toEqual({ customer: { id: 7, tags: ['vip', 'eu'] }, tags: ['a'] });
    expect({ first: first.status === 'ran' && first.body, saved: JSON.parse((await record(key)).body) }).toEqual({ first: expected, saved: expected });
  });

  it("writes the guard store's row format: the store reads the answer, and its claim of the key replays it", async () => {
    const key = `format:${randomUUID()}`;
    const store = new PostgresIdempotencyStore(dataSource);
    await transactions.run({ key }, async () => ({ statusCode: 202, body: { accepted: true } }));
    expect(await store.get(key)).toMatchObject({
      state: 'completed',
      response: { statusCode: 202, headers: { 'content-type': 'application/json; charset=utf-8' }, body: '{"accepted":true}' },
    });
    expect(await store.claim({ key, token: 't', fingerprint: '', leaseMs: 1000 })).toMatchObject({ status: 'completed' });
  });

  it('lets the store forget a committed answer, so the work runs again; a run in flight has committed nothing to forget', async () => {
    const key = `forget:${randomUUID()}`;
    const store = new PostgresIdempotencyStore(dataSource);
    expect(await transactions.run({ key }, pay(key))).toMatchObject({ status: 'ran' });
    expect(await store.forget(key)).toEqual({ forgotten: true });
    const held = gate();
    let inside = false;
    const running = transactions.run({ key }, async (manager) => {
      const answer = await pay(key)(manager);
      inside = true;
      await held.opened;
      return answer;
    });
    await until(async () => inside);
    // Its claim row is not committed: the forget neither sees it nor waits for it.
    expect(await store.forget(key)).toEqual({ forgotten: false, reason: 'absent' });
    held.open();
    expect(await running).toMatchObject({ status: 'ran' });
    expect(await transactions.run({ key }, pay(key))).toMatchObject({ status: 'replayed' });
    expect(await payments(key)).toBe(2);
  });

  it('saves an answer without a body, and a 200 when the work names no status', async () => {
    const key = `nobody:${randomUUID()}`;
    expect(await transactions.run({ key }, async () => ({ body: undefined }))).toEqual({ status: 'ran', statusCode: 200, body: undefined });
    expect(await transactions.run({ key }, async () => ({ body: 'never' }))).toEqual({ status: 'replayed', statusCode: 200, body: undefined });
    expect(await record(key)).toMatchObject({ has_body: false, body: null });
  });

  it('answers mismatch to another fingerprint; an empty fingerprint on either side is not compared', async () => {
    const key = `fp:${randomUUID()}`;
    await transactions.run({ key, fingerprint: 'a' }, pay(key));
    const never = async (): Promise<never> => {
      throw new Error('the work must not run');
    };
    expect(await transactions.run({ key, fingerprint: 'b' }, never)).toEqual({ status: 'mismatch' });
    expect(await transactions.run({ key }, never)).toMatchObject({ status: 'replayed' });
    const open = `fp-open:${randomUUID()}`;
    await transactions.run({ key: open }, pay(open));
    expect(await transactions.run({ key: open, fingerprint: 'b' }, never)).toMatchObject({ status: 'replayed' });
    expect(await payments(key)).toBe(1);
  });

  it('takes an expired answer over in the same transaction and runs again', async () => {
    const key = `expired:${randomUUID()}`;
    const first = await transactions.run({ key, fingerprint: 'old' }, pay(key, 1));
    await expire(key);
    const second = await transactions.run({ key, fingerprint: 'new' }, pay(key, 2));
    expect(second).toMatchObject({ status: 'ran', body: { amount: 2 } });
    expect(await payments(key)).toBe(2);
    expect(await record(key)).toMatchObject({ state: 'completed', fingerprint: 'new' });
    expect(first.status === 'ran' && first.body.id).not.toBe(second.status === 'ran' && second.body.id);
  });

  it("answers in_progress to a live claim of the guard's store, and takes it over once its lease has run out", async () => {
    const key = `store-claim:${randomUUID()}`;
    const store = new PostgresIdempotencyStore(dataSource);
    await store.claim({ key, token: 'guard', fingerprint: '', leaseMs: 10_000 });
    const refused = await transactions.run({ key }, pay(key));
    expect(refused).toEqual({ status: 'in_progress', retryAfterMs: expect.any(Number) });
    expect((refused as { retryAfterMs: number }).retryAfterMs).toBeGreaterThan(8000);
    await expire(key); // the guard's process died: nobody renews its lease
    expect(await transactions.run({ key }, pay(key))).toMatchObject({ status: 'ran' });
    expect(await store.complete(key, 'guard', { statusCode: 200, headers: {} }, 1000)).toBe(false); // fenced out
    expect(await payments(key)).toBe(1);
  });

  it('rolls everything back when the work throws, rethrows its error, and the retry runs', async () => {
    const key = `throws:${randomUUID()}`;
    const failure = new Error('card declined');
    await expect(
      transactions.run({ key }, async (manager) => {
        await pay(key)(manager);
        throw failure;
      }),
    ).rejects.toBe(failure);
    expect(await payments(key)).toBe(0);
    expect(await record(key)).toBeUndefined();
    // An answer that is not JSON-able fails inside the transaction too.
    await expect(transactions.run({ key }, async (manager) => ({ body: { id: (await pay(key)(manager)).body.id, big: 1n } }))).rejects.toThrow(
      TypeError,
    );
    expect(await payments(key)).toBe(0);
    expect(await transactions.run({ key }, pay(key))).toMatchObject({ status: 'ran' });
    expect(await payments(key)).toBe(1);
  });

  // An adversarial helper: a statusCode of 0, 99 or 1000 committed the effect under an answer
  // of 500 for the whole retention; '201' answered the first client 500 and every retry 201;
  // null ran as null and replayed as 200. Refused now, inside the transaction: nothing commits.
  it.each([0, 99, 1000, 201.5, NaN, '201', null, 201n])('refuses the statusCode %p from the work and commits nothing', async (statusCode) => {
    const key = `status:${randomUUID()}`;
    await expect(
      transactions.run({ key }, async (manager) => ({ ...(await pay(key)(manager)), statusCode: statusCode as number })),
    ).rejects.toThrow(RangeError);
    expect(await payments(key)).toBe(0);
    expect(await record(key)).toBeUndefined();
    expect(await transactions.run({ key }, pay(key))).toMatchObject({ status: 'ran' });
  });

  it("throws a constraint the COMMIT checks (deferred) as the database's error, as the work's own: nothing saved, the retry runs", async () => {
    // Wrapped as an IdempotencyStoreError, a business conflict read as an outage (an app maps
    // those to 503), and uniqueViolationOf() found nothing in it (an adversarial helper).
    const table = `"${schema}".tickets`;
    await sql(`CREATE TABLE IF NOT EXISTS ${table} (seat text NOT NULL, CONSTRAINT uq_tickets_seat UNIQUE (seat) DEFERRABLE INITIALLY DEFERRED)`);
    const key = `deferred:${randomUUID()}`;
    const seat = randomUUID();
    const failure = await transactions
      .run({ key }, async (manager) => {
        await manager.query(`INSERT INTO ${table} (seat) VALUES ($1), ($1)`, [seat]);
        return { statusCode: 201, body: { seat } };
      })
      .then(
        () => undefined,
        (error: unknown) => error,
      );
    expect(failure).not.toBeInstanceOf(IdempotencyStoreError);
    expect(uniqueViolationOf(failure)).toMatchObject({ constraint: 'uq_tickets_seat' });
    expect(await record(key)).toBeUndefined();
    expect(await transactions.run({ key }, async (manager) => (await manager.query(`INSERT INTO ${table} (seat) VALUES ($1)`, [seat]), { body: { seat } }))).toMatchObject({
      status: 'ran',
    });
  });

  it('gives one key to one of 50 concurrent duplicates over a pool of 20: one effect, the others replay', async () => {
    const key = `race:${randomUUID()}`;
    const results = await Promise.all(
      Array.from({ length: 50 }, () =>
        transactions.run({ key, fingerprint: 'fp' }, async (manager) => {
          const answer = await pay(key)(manager);
          // Hold the transaction open, so that the duplicates queue on its uncommitted row.
          await manager.query('SELECT pg_sleep(0.05)');
          return answer;
        }),
      ),
    );
    expect((dataSource.driver as unknown as { master: Pool }).master.totalCount).toBeGreaterThanOrEqual(10);
    const ran = results.filter((r) => r.status === 'ran');
    expect(ran).toHaveLength(1);
    expect(results.filter((r) => r.status === 'replayed' || r.status === 'in_progress')).toHaveLength(49);
    for (const r of results.filter((r) => r.status === 'replayed')) expect(r).toEqual({ ...ran[0], status: 'replayed' });
    expect(await payments(key)).toBe(1);
  });

  describe('a duplicate that arrives while the first transaction runs', () => {
    /** Starts a first run whose work has written its payment and waits for `release` before it ends. */
    async function holdFirst(key: string, end: 'commit' | 'throw') {
      const inside = gate();
      const release = gate();
      const first = transactions.run({ key }, async (manager) => {
        const answer = await pay(key, 1)(manager);
        inside.open();
        await release.opened;
        if (end === 'throw') throw new Error('first failed');
        return answer;
      });
      first.catch(() => undefined);
      await inside.opened;
      return { first, release: release.open };
    }

    it('waits on its uncommitted row and replays when it commits', async () => {
      const key = `wait-commit:${randomUUID()}`;
      const { first, release } = await holdFirst(key, 'commit');
      const duplicate = transactions.run({ key }, pay(key, 2));
      await until(async () => (await waitingOnLock('inserted AS (')) > 0);
      expect(await waitingOnLock('inserted AS (')).toBe(1);
      release();
      const ran = await first;
      expect(await duplicate).toEqual({ ...ran, status: 'replayed' });
      expect(await payments(key)).toBe(1);
    });

    it('takes the key and runs when it rolls back', async () => {
      const key = `wait-rollback:${randomUUID()}`;
      const { first, release } = await holdFirst(key, 'throw');
      const duplicate = transactions.run({ key }, pay(key, 2));
      await until(async () => (await waitingOnLock('inserted AS (')) > 0);
      release();
      await expect(first).rejects.toThrow('first failed');
      expect(await duplicate).toMatchObject({ status: 'ran', body: { amount: 2 } });
      expect(await payments(key)).toBe(1);
    });

    it('answers in_progress once lockTimeoutMs has passed, without bounding the work\'s own lock waits', async () => {
      const key = `wait-timeout:${randomUUID()}`;
      const impatient = new IdempotentTransactions(dataSource, { lockTimeoutMs: 150 });
      const { first, release } = await holdFirst(key, 'commit');
      let workTimeout = '';
      const started = Date.now();
      const refused = await impatient.run({ key }, pay(key, 2));
      expect(refused).toEqual({ status: 'in_progress', retryAfterMs: 150 });
      expect(Date.now() - started).toBeGreaterThanOrEqual(140);
      release();
      await first;
      expect(await impatient.run({ key }, pay(key, 2))).toMatchObject({ status: 'replayed', body: { amount: 1 } });
      const other = `wait-timeout-work:${randomUUID()}`;
      await impatient.run({ key: other }, async (manager) => {
        workTimeout = (await manager.query(`SELECT current_setting('lock_timeout') AS t`))[0].t;
        return { body: null };
      });
      expect(workTimeout).toBe((await sql(`SELECT current_setting('lock_timeout') AS t`))[0].t);
      expect(await payments(key)).toBe(1);
    });

    // Session 14's adversaries: the app's own statement_timeout below lockTimeoutMs cancelled the
    // wait (57014), and the duplicate was answered an IdempotencyStoreError (a 500), not in_progress.
    it("answers in_progress when the app's statement_timeout ends the wait before lockTimeoutMs", async () => {
      const key = `wait-statement-timeout:${randomUUID()}`;
      const bounded = new DataSource({ ...dataSource.options, migrationsRun: false, extra: { max: 2, statement_timeout: 150 } } as DataSourceOptions);
      await bounded.initialize();
      const { first, release } = await holdFirst(key, 'commit');
      try {
        const refused = await new IdempotentTransactions(bounded).run({ key }, pay(key, 2)).finally(release);
        expect(refused).toEqual({ status: 'in_progress', retryAfterMs: 3000 });
        await first;
        expect(await new IdempotentTransactions(bounded).run({ key }, pay(key, 2))).toMatchObject({ status: 'replayed', body: { amount: 1 } });
        expect(await payments(key)).toBe(1);
      } finally {
        await bounded.destroy();
      }
    });

    it("makes the guard store's claim of the key wait, then see the answer", async () => {
      const key = `wait-store:${randomUUID()}`;
      const store = new PostgresIdempotencyStore(dataSource);
      const { first, release } = await holdFirst(key, 'commit');
      const claim = store.claim({ key, token: 'guard', fingerprint: '', leaseMs: 10_000 });
      await until(async () => (await waitingOnLock('claimed AS (')) > 0);
      release();
      const ran = await first;
      expect(await claim).toEqual({ status: 'completed', response: expect.objectContaining({ statusCode: 201 }) });
      expect(ran.status).toBe('ran');
    });
  });

  it('files a key over 1,020 bytes under its digest form (recordKey), which a retry finds', async () => {
    const key = `long:${randomUUID()}:${'é'.repeat(1500)}`;
    expect(await transactions.run({ key }, pay(key))).toMatchObject({ status: 'ran' });
    expect(await transactions.run({ key }, pay(key))).toMatchObject({ status: 'replayed' });
    expect(recordKey(key)).toMatch(/#sha256:/);
    expect(await record(key)).toMatchObject({ state: 'completed' });
    expect(await payments(key)).toBe(1);
  });

  // An adversarial helper: a work reading through a repository of the DataSource (as an injected
  // one is) asks the pool for a second connection; with as many runs at once as the pool has
  // connections, each waited for one none freed, and the app hung for good (every later request too).
  it('fails a work that waits for a connection of its own while every connection is held by runs, instead of hanging, and says why once', async () => {
    const small = new DataSource({ ...(dataSource.options as DataSourceOptions), migrationsRun: false, extra: { max: 2 } } as DataSourceOptions);
    await small.initialize();
    const warnings = jest.spyOn(Logger.prototype, 'warn').mockImplementation(() => undefined);
    try {
      const bounded = new IdempotentTransactions(small, { lockTimeoutMs: 500 });
      const run = (key: string) =>
        bounded.run({ key, fingerprint: 'fp' }, async (manager) => {
          // The mistake: a read through the DataSource's own repository, then the write through the manager.
          await small.getRepository(Payment).countBy({ opKey: key });
          return pay(key)(manager);
        });
      const keys = [0, 1, 2, 3].map(() => `side:${randomUUID()}`);
      const outcomes = await Promise.race([
        Promise.all(keys.map((key) => run(key).then((result) => result.status, (error: Error) => error.constructor.name))),
        new Promise<'hung'>((resolve) => setTimeout(resolve, 8000, 'hung')),
      ]);
      // Observed before: 'hung' (both connections held by runs, each waiting for a third).
      expect(outcomes).not.toBe('hung');
      expect(outcomes).toContain('IdempotencyConfigError');
      expect((outcomes as string[]).every((outcome) => outcome === 'ran' || outcome === 'IdempotencyConfigError')).toBe(true);
      // Nothing committed without its record, and the pool serves again: a run alone ran.
      for (const key of keys) expect(await payments(key)).toBe((await record(key)) ? 1 : 0);
      const alone = `side:${randomUUID()}`;
      expect(await run(alone)).toMatchObject({ status: 'ran' });
      expect(warnings.mock.calls.map(([message]) => String(message)).filter((message) => /connection of its own/.test(message))).toHaveLength(1);

      // What a work starts (a timer, a poller) keeps its async context after it: its later asks
      // are not the run's, and wait for a connection as any do (a helper: 21 of 27 refused).
      let poller!: AsyncResource;
      await bounded.run({ key: `side:${randomUUID()}` }, async (manager) => {
        poller = new AsyncResource('poller');
        return pay(`poll:${randomUUID()}`)(manager);
      });
      const busy = [small.query('SELECT pg_sleep(0.8)'), small.query('SELECT pg_sleep(0.8)')];
      const pool = (small.driver as unknown as { master: { idleCount: number; totalCount: number } }).master;
      while (pool.idleCount > 0 || pool.totalCount < 2) await new Promise((resolve) => setTimeout(resolve, 5));
      expect(await poller.runInAsyncScope(() => small.query('SELECT 1 AS one'))).toEqual([{ one: 1 }]);
      await Promise.all(busy);

      // A run nested in a work, refused a connection, is the app's mistake, not an outage.
      const nested = Promise.all(
        [0, 1].map(() =>
          bounded.run({ key: `outer:${randomUUID()}` }, async (manager) => {
            await bounded.run({ key: `inner:${randomUUID()}` }, pay(`inner:${randomUUID()}`));
            return pay(`outer:${randomUUID()}`)(manager);
          }),
        ),
      );
      await expect(nested).rejects.toBeInstanceOf(IdempotencyConfigError);
    } finally {
      warnings.mockRestore();
      await small.destroy();
    }
  });

  // An adversarial helper: a work that ended the transaction through its QueryRunner had its
  // writes committed with the claim and no answer (duplicates ran again; the first got "Transaction
  // is not started yet"), and one that caught a failed statement was told of a store outage.
  it("refuses a work that ended the run's transaction itself, or caught a failed statement and went on, as the work's mistake", async () => {
    const ended = `ended:${randomUUID()}`;
    await expect(
      transactions.run({ key: ended }, async (manager) => {
        await manager.save(Payment, { opKey: ended, amount: 1 });
        await manager.queryRunner!.commitTransaction();
        return { statusCode: 201, body: undefined };
      }),
    ).rejects.toThrow(/ended the run's transaction itself/);
    expect(await record(ended)).not.toMatchObject({ state: 'completed' });
    const caught = `caught:${randomUUID()}`;
    const run = transactions.run({ key: caught }, async (manager) => {
      await manager.query('SELECT 1 / 0').catch(() => undefined);
      return { statusCode: 409, body: { code: 'DUPLICATE' } };
    });
    await expect(run).rejects.toBeInstanceOf(IdempotencyConfigError);
    await expect(run).rejects.toThrow(/caught the error/);
    expect(await record(caught)).toBeUndefined();
  });

  it('purges expired records of the shared table', async () => {
    const key = `purge:${randomUUID()}`;
    await transactions.run({ key }, async () => ({ body: 1 }));
    await expire(key);
    expect(await transactions.purgeExpired()).toBeGreaterThanOrEqual(1);
    expect(await record(key)).toBeUndefined();
  });

  it("keeps the store's expired claims for keepExpiredClaimsMs: their late saves may still land", async () => {
    const key = `purge-claim:${randomUUID()}`;
    const store = new PostgresIdempotencyStore(dataSource);
    await store.claim({ key, token: 't', fingerprint: '', leaseMs: 60_000 });
    await expire(key);
    await transactions.purgeExpired();
    expect(await record(key)).toMatchObject({ state: 'processing' });
    await new IdempotentTransactions(dataSource, { keepExpiredClaimsMs: 0 }).purgeExpired();
    expect(await record(key)).toBeUndefined();
  });

  // Sent as UTF-8, a lone surrogate becomes U+FFFD: 'k\uD83D' and 'k\uDE00' were one key, and the
  // second run was answered the first's body; a NUL failed as a store error (an adversarial helper).
  it('refuses a key that is not well-formed text (a lone surrogate) or holds a NUL, before any transaction', async () => {
    let ran = 0;
    for (const key of [`lone-${randomUUID()}\uD83D`, `lone-${randomUUID()}\uDE00`, `nul-${randomUUID()}\0`]) {
      await expect(transactions.run({ key }, async () => ({ body: ++ran }))).rejects.toThrow(IdempotencyKeyError);
    }
    expect(ran).toBe(0);
  });

  // An adversarial helper (session 19): a fingerprint of 129 characters failed in the database and
  // was reported as an IdempotencyStoreError, a store outage, where the caller's value was at fault.
  it('refuses a fingerprint the table cannot hold as given (over 128 characters, a NUL, a lone surrogate), before any transaction', async () => {
    let ran = 0;
    for (const fingerprint of ['f'.repeat(129), 'fp\0', 'fp\uD83D']) {
      const refused = await transactions.run({ key: `fp-${randomUUID()}`, fingerprint }, async () => ({ body: ++ran })).catch((error: unknown) => error);
      expect(refused).toBeInstanceOf(IdempotencyError);
      expect(refused).not.toBeInstanceOf(IdempotencyStoreError);
      expect((refused as Error).message).toMatch(/fingerprint/);
    }
    expect(ran).toBe(0);
    // 128 characters, each outside the BMP (256 UTF-16 units), fit.
    const wide = '\u{1F600}'.repeat(128);
    expect(await transactions.run({ key: `fp-${randomUUID()}`, fingerprint: wide }, async () => ({ body: ++ran }))).toMatchObject({ status: 'ran' });
  });

  // A blank key (a message id a producer left as spaces, a zero-width space) keyed every such call
  // alike: the second was answered the first's body. Refused as the guard refuses such a key.
  it('refuses a key of white space or invisible characters only, before any transaction', async () => {
    let ran = 0;
    for (const key of [' ', '   ', '\t', '\u200B', ' \u2060 ']) {
      const refused = await transactions.run({ key }, async () => ({ body: ++ran })).catch((error: unknown) => error);
      expect(refused).toBeInstanceOf(IdempotencyKeyError);
      expect((refused as Error).message).toMatch(/only white space or invisible characters/);
    }
    expect(ran).toBe(0);
  });

  it('refuses an empty key, a DataSource other than postgres and a wait bound that is not positive', async () => {
    await expect(transactions.run({ key: '' }, async () => ({ body: 1 }))).rejects.toThrow(IdempotencyKeyError);
    const mysql = { options: { type: 'mysql' } } as DataSource;
    expect(() => new IdempotentTransactions(mysql)).toThrow(IdempotencyConfigError);
    expect(() => new IdempotentTransactions(dataSource, { lockTimeoutMs: 0 })).toThrow(IdempotencyConfigError);
    expect(() => new IdempotentTransactions(dataSource, { retentionMs: -1 })).toThrow(IdempotencyConfigError);
  });
});
