import { afterAll, afterEach, beforeAll, beforeEach, describe, expect, it } from '@jest/globals';
import { createHash, randomUUID } from 'node:crypto';
import { DataSource, QueryFailedError } from 'typeorm';
import { DATABASE_URL } from '../../../../../test/support/services.js';
import { TcpProxy } from '../../../../../test/support/tcp-proxy.js';
import { adminQuery, dropSchemaDataSource, openSchemaDataSource, testSchemaName } from '../../../../../test/support/test-schema.js';
import { IdempotencyStoreError } from '../../index.js';
import { IDEMPOTENCY_ENTITIES } from '../entities.js';
import { uniqueViolationOf } from '../helpers/unique-violation.js';
import { IDEMPOTENCY_MIGRATIONS } from '../migrations.js';
import { PostgresIdempotencyStore } from '../store/postgres-idempotency.store.js';
import { statementRunner } from './statements.js';

const sleep = (ms: number) => new Promise<void>((resolve) => setTimeout(resolve, ms));

/**
 * Runs `work` on a DataSource whose connections go through a proxy (`delayMs` holds what comes
 * back), with pg-pool's `extra`; stops both after, whatever `work` did.
 */
async function withProxy(extra: Record<string, unknown>, work: (proxy: TcpProxy, dataSource: DataSource) => Promise<void>): Promise<void> {
  const target = new URL(DATABASE_URL);
  const proxy = await new TcpProxy({ host: target.hostname, port: Number(target.port || 5432) }).start();
  const viaProxy = new URL(DATABASE_URL);
  viaProxy.port = String(proxy.port);
  const dataSource = new DataSource({ type: 'postgres', url: viaProxy.toString(), extra });
  try {
    await dataSource.initialize();
    await work(proxy, dataSource);
  } finally {
    await proxy.stop();
    await dataSource.destroy().catch(() => undefined);
  }
}

/** What this session has prepared: each statement's text and how many times it ran. */
const PREPARED = `SELECT statement, generic_plans + custom_plans AS runs, from_sql FROM pg_prepared_statements`;

describe('statementRunner: named prepared statements on the pool or on a transaction runner', () => {
  const schema = testSchemaName();
  // One connection: every statement below meets what the earlier ones prepared on it.
  let single: DataSource;
  let table: string;

  beforeAll(async () => {
    single = await openSchemaDataSource(schema, {
      entities: IDEMPOTENCY_ENTITIES,
      migrations: IDEMPOTENCY_MIGRATIONS,
      migrationsRun: true,
      extra: { max: 1 },
    });
  });
  afterAll(async () => {
    await dropSchemaDataSource(single);
  });

  beforeEach(async () => {
    table = `"${schema}"."t_${randomUUID().slice(0, 8)}"`;
    await single.query(`CREATE TABLE ${table} (id int PRIMARY KEY, v int NOT NULL)`);
  });

  it("prepares the store's claim once per connection and runs it again from there", async () => {
    const store = new PostgresIdempotencyStore(single);
    for (let i = 0; i < 7; i++) await store.claim({ key: `prepared:${randomUUID()}`, token: 't', fingerprint: '', leaseMs: 60_000 });
    const claims = (await single.query(PREPARED)).filter((row: { statement: string }) => row.statement.includes('claimed AS ('));
    expect(claims).toEqual([expect.objectContaining({ runs: '7', from_sql: false })]);
  });

  it('prepares a statement again when a migration changed its result type under it (0A000), and answers', async () => {
    const store = new PostgresIdempotencyStore(single);
    const key = `migrated:${randomUUID()}`;
    await store.claim({ key, token: 't', fingerprint: '', leaseMs: 60_000 });
    await store.complete(key, 't', { statusCode: 201, headers: {}, body: '{"id":1}' }, 60_000);
    expect(await store.get(key)).toMatchObject({ state: 'completed', response: { body: '{"id":1}' } });
    // The prepared `get` returns `body` as text; from now on the column is varchar.
    await adminQuery(`ALTER TABLE "${schema}".idempotency_records ALTER COLUMN body TYPE varchar`);
    expect(await store.get(key)).toMatchObject({ state: 'completed', response: { body: '{"id":1}' } });
  });

  it("runs on a transaction's runner: its connection and uncommitted rows; a refused statement aborts only that transaction", async () => {
    const two = await openSchemaDataSource(testSchemaName(), { extra: { max: 2 } });
    const run = statementRunner(two);
    const runner = two.createQueryRunner();
    try {
      await runner.startTransaction();
      await run(`INSERT INTO ${table} (id, v) VALUES ($1, $2)`, [1, 10], runner);
      expect((await run(`SELECT v FROM ${table} WHERE id = $1`, [1], runner)).records).toEqual([{ v: 10 }]);
      // The pool's other connection does not see the uncommitted row.
      expect((await run(`SELECT v FROM ${table} WHERE id = $1`, [1])).records).toEqual([]);
      await runner.commitTransaction();

      await adminQuery(`ALTER TABLE ${table} ALTER COLUMN v TYPE bigint`);
      await runner.startTransaction();
      const refused = await run(`SELECT v FROM ${table} WHERE id = $1`, [1], runner).catch((error: unknown) => error);
      expect(refused).toBeInstanceOf(IdempotencyStoreError);
      expect(((refused as Error).cause as QueryFailedError & { driverError: { code: string } }).driverError.code).toBe('0A000');
      await runner.rollbackTransaction();

      await runner.startTransaction();
      expect((await run(`SELECT v FROM ${table} WHERE id = $1`, [1], runner)).records).toEqual([{ v: '10' }]);
      await runner.commitTransaction();
    } finally {
      if (runner.isTransactionActive) await runner.rollbackTransaction();
      await runner.release();
      await dropSchemaDataSource(two);
    }
  });

  it('turns a database error into IdempotencyStoreError (cause: QueryFailedError with the SQLSTATE) and keeps the connection', async () => {
    const run = statementRunner(single);
    const backend = async () => ((await run('SELECT pg_backend_pid() AS pid', [])).records as { pid: number }[])[0].pid;
    const before = await backend();
    await run(`INSERT INTO ${table} (id, v) VALUES ($1, $2)`, [1, 1]);
    const error = await run(`INSERT INTO ${table} (id, v) VALUES ($1, $2)`, [1, 2]).catch((e: unknown) => e);
    expect(error).toBeInstanceOf(IdempotencyStoreError);
    expect((error as Error).message).toMatch(/duplicate key/);
    expect((error as Error).cause).toBeInstanceOf(QueryFailedError);
    expect(uniqueViolationOf((error as Error).cause)).toMatchObject({ driver: 'postgres' });
    expect(await backend()).toBe(before);
    const missing = await run(`SELECT v FROM "${schema}".no_such_table`, []).catch((e: unknown) => e);
    expect(missing).toBeInstanceOf(IdempotencyStoreError);
    expect((missing as Error).message).toMatch(/no_such_table/);
  });

  it('runs statements unnamed once a session lost one it prepared (DISCARD ALL, a pooler in transaction mode)', async () => {
    const run = statementRunner(single);
    const read = () => run(`SELECT v FROM ${table} WHERE id = $1`, [1]);
    await run(`INSERT INTO ${table} (id, v) VALUES ($1, $2)`, [1, 5]);
    expect((await read()).records).toEqual([{ v: 5 }]);
    await single.query('DISCARD ALL');
    expect((await read()).records).toEqual([{ v: 5 }]);
    expect((await read()).records).toEqual([{ v: 5 }]);
    expect(await single.query(PREPARED)).toEqual([]);
  });

  // An adversarial helper (session 21), through PgBouncer in transaction mode: a server session
  // already held the statement another client had prepared, PostgreSQL answered 42P05, the claim
  // failed as a store outage and routes ran unguarded. A session that holds the name, made here
  // with PREPARE on the one connection (the pooler's case without a pooler: PostgreSQL's own 42P05).
  it('runs statements unnamed once a session holds one of its names that another client prepared (a transaction-mode pooler)', async () => {
    const run = statementRunner(single);
    const sql = `SELECT v FROM ${table} WHERE id = $1`;
    const name = `idempotency_${createHash('sha256').update(sql).digest('hex').slice(0, 24)}`;
    await single.query(`INSERT INTO ${table} (id, v) VALUES (1, 7)`);
    await single.query(`PREPARE ${name} (int) AS SELECT 0 AS v WHERE $1 = 0`);
    try {
      expect((await run(sql, [1])).records).toEqual([{ v: 7 }]);
      expect((await run(sql, [1])).records).toEqual([{ v: 7 }]);
      // Only the other client's statement is there: this runner prepares no more.
      expect(await single.query('SELECT name, from_sql FROM pg_prepared_statements')).toEqual([{ name, from_sql: true }]);
    } finally {
      await single.query('DEALLOCATE ALL');
    }
  });

  // An adversarial helper (session 16): 100 parallel replays of a 1 MB response on a pool of 10,
  // with a 300 ms bound, on a healthy database: 74 to 87 were failed as an outage (503, or a
  // fail-open route's handler ran again) because their wait in the pool's queue hit the bound.
  it("waits for a connection past its bound while the pool's statements answer (a queue, not an outage)", async () => {
    const run = statementRunner(single, { timeoutMs: 300 });
    const outcomes = await Promise.allSettled(Array.from({ length: 8 }, () => run('SELECT pg_sleep(0.1) AS slept', [])));
    expect(outcomes.map((outcome) => outcome.status)).toEqual(Array.from({ length: 8 }, () => 'fulfilled'));
  });

  // An adversarial helper (session 17): the app's own queries wait in the same queue. 200 of them
  // (100 ms each) on a pool of 10, then replays of 20 completed keys on a fail-open route, with a
  // 300 ms bound: 20 of 20 handlers ran again; at the default bound, 800 queries did the same.
  it("waits for a connection past its bound while the app's own queries keep the pool moving", async () => {
    const run = statementRunner(single, { timeoutMs: 300 });
    const appQueries = Array.from({ length: 6 }, () => single.query('SELECT pg_sleep(0.1)'));
    const queued = await Promise.allSettled([run('SELECT 1 AS one', [])]);
    await Promise.all(appQueries);
    expect(queued.map((outcome) => outcome.status)).toEqual(['fulfilled']);
  });

  // A storm of claims filled the pool's queue and a held claim's renewal waited behind them all
  // (test/renewal-priority.e2e-spec.ts): an urgent runner's statement goes to the front. Moved
  // there every time, the renewals of many held claims starved the app's own queries (a
  // reviewing helper: one still waiting after 15 s): once urgent ones wait, the two take turns.
  it('runs an urgent statement at the next free connection, then urgent and other statements take turns', async () => {
    const plain = statementRunner(single, { timeoutMs: 5000 });
    const urgent = statementRunner(single, { timeoutMs: 5000, urgent: true });
    const order: string[] = [];
    const busy = single.query('SELECT pg_sleep(0.2)');
    await new Promise((resolve) => setTimeout(resolve, 50)); // the only connection is taken
    const runs = [
      plain('SELECT 1', []).then(() => order.push('claim 1')),
      single.query('SELECT 1').then(() => order.push('app query')),
      plain('SELECT 1', []).then(() => order.push('claim 2')),
      urgent('SELECT 1', []).then(() => order.push('renewal 1')),
      urgent('SELECT 1', []).then(() => order.push('renewal 2')),
      urgent('SELECT 1', []).then(() => order.push('renewal 3')),
      urgent('SELECT 1', []).then(() => order.push('renewal 4')),
    ];
    await busy;
    await Promise.all(runs);
    expect(order).toEqual(['renewal 1', 'claim 1', 'renewal 2', 'app query', 'renewal 3', 'claim 2', 'renewal 4']);
  });

  // A reviewing helper (session 17): with pg's `query_timeout` (the README suggests it for
  // TypeORM's own queries), statements on a hung server fail and their connections go back to the
  // pool without an error, one each `query_timeout`. That is no sign of a database that moves.
  it("fails a wait for a connection at its bound when the app's queries only time out on a hung server", async () => {
    await withProxy({ max: 1, query_timeout: 100 }, async (proxy, hung) => {
      const run = statementRunner(hung, { timeoutMs: 300 });
      await run('SELECT 1 AS one', []);
      proxy.delayMs = 60_000;
      // 30 × 100 ms: a wait they kept going would last ~3 s (a loaded machine must not make a
      // wait that failed at its bound look that long).
      const appQueries = Array.from({ length: 30 }, () => hung.query('SELECT 1').catch((error: unknown) => error));
      const started = Date.now();
      const outcome = await run('SELECT 1 AS one', []).then(
        () => 'answered',
        (error: Error) => error.message,
      );
      expect({ outcome, fast: Date.now() - started < 2000 }).toEqual({ outcome: expect.stringMatching(/no answer within 300 ms/), fast: true });
      await Promise.all(appQueries);
    });
  });

  // pg's `query_timeout` rejects a statement but leaves it on its connection: given back whole,
  // the connection served the next statement behind the one still waiting, which failed in turn.
  it("gives back as broken a connection whose statement failed on pg's query_timeout, and answers on a new one", async () => {
    // 500 ms, under the runner's bound: 100 ms failed the first statement itself on a loaded machine.
    await withProxy({ max: 1, query_timeout: 500 }, async (proxy, timed) => {
      const run = statementRunner(timed, { timeoutMs: 5000 });
      await run('SELECT 1 AS one', []);
      proxy.delayMs = 60_000;
      await expect(run('SELECT 2 AS two', [])).rejects.toThrow(/Query read timeout/);
      proxy.delayMs = 0;
      expect((await run('SELECT 3 AS three', [])).records).toEqual([{ three: 3 }]);
    });
  });

  // A reviewing helper (session 17): the bytes of a NOTIFY to a listening session are no answer,
  // and go on through an outage; nor were connections handed out before the store's first call
  // watched (their answers went unseen: a false outage).
  describe('what shows the pool moving, on a pool of its own', () => {
    let own: DataSource;
    let ownSchema: string;
    beforeEach(async () => {
      ownSchema = testSchemaName();
      own = await openSchemaDataSource(ownSchema, { extra: { max: 2 } });
    });
    afterEach(async () => {
      await dropSchemaDataSource(own);
    });

    it('fails a wait at its bound through a lock, though a listening connection keeps getting NOTIFYs', async () => {
      const { Client } = (await import('pg')).default;
      const [locker, notifier] = [new Client({ connectionString: DATABASE_URL }), new Client({ connectionString: DATABASE_URL })];
      await Promise.all([locker.connect(), notifier.connect()]);
      const listener = own.createQueryRunner();
      const locked = `"${ownSchema}".locked`;
      let ticking: NodeJS.Timeout | undefined;
      try {
        await own.query(`CREATE TABLE ${locked} (id int)`);
        const run = statementRunner(own, { timeoutMs: 300 });
        await run('SELECT 1 AS one', []);
        // The app's two connections: one listening, one waiting for the lock.
        await listener.connect();
        await listener.query('LISTEN idempotency_spec');
        await locker.query('BEGIN');
        await locker.query(`LOCK TABLE ${locked} IN ACCESS EXCLUSIVE MODE`);
        const blocked = own.query(`SELECT * FROM ${locked}`).catch(() => undefined);
        ticking = setInterval(() => void notifier.query(`NOTIFY idempotency_spec, '${'x'.repeat(500)}'`).catch(() => undefined), 20);
        // Unwatched, the NOTIFYs kept it waiting for as long as the lock held (60 s here; 10 s now).
        const unlock = setTimeout(() => void locker.query('ROLLBACK'), 10_000);
        const started = Date.now();
        const outcome = await run('SELECT 1 AS one', []).then(() => 'answered', (error: Error) => error.message);
        clearTimeout(unlock);
        expect({ outcome, fast: Date.now() - started < 5000 }).toEqual({ outcome: expect.stringMatching(/no answer within 300 ms/), fast: true });
        await locker.query('ROLLBACK');
        await blocked;
      } finally {
        clearInterval(ticking);
        await listener.release();
        await Promise.all([locker.end(), notifier.end()]);
      }
    });

    it('counts the answer coming in on a connection the app had taken before the first bounded call', async () => {
      const streaming = own.query(`SELECT repeat('x', 20000) AS part, pg_sleep(0.02) FROM generate_series(1, 30)`);
      const holder = own.query('SELECT pg_sleep(0.8)');
      await sleep(50);
      const run = statementRunner(own, { timeoutMs: 300 });
      const outcome = await run('SELECT 1 AS one', []).then(() => 'answered', (error: Error) => error.message);
      await Promise.all([streaming, holder]);
      expect(outcome).toBe('answered');
    });
  });

  // An adversarial helper (session 17): a burst of 1 MB replays on a cold pool of 60 sent 60
  // statements at once, and none had finished within the bound while their answers came in:
  // counting answers only failed the 340 waiting calls (on a fail-open route, 34 runs a key).
  it('waits for a connection past its bound while an answer comes in on the pool, before any statement ends', async () => {
    // A 1 s bound against rows 20 ms apart: a loaded machine that stalls the process or the server
    // for a few hundred ms (seen once at a 300 ms bound) still leaves the stream moving.
    const run = statementRunner(single, { timeoutMs: 1000 });
    // 80 rows of 20 KB, one each 20 ms (1.6 s, past the bound): each fills pg's send buffer, so it goes out as it comes.
    const streaming = run(`SELECT repeat('x', 20000) AS part, pg_sleep(0.02) FROM generate_series(1, 80)`, []);
    const queued = run('SELECT 1 AS one', []);
    const [first, second] = await Promise.allSettled([streaming, queued]);
    expect([first.status, second.status]).toEqual(['fulfilled', 'fulfilled']);
  });

  it("runs on the primary's pool when the DataSource has replicas", async () => {
    const replicated = new DataSource({
      type: 'postgres',
      schema,
      replication: {
        master: { url: DATABASE_URL, applicationName: 'idempotency-primary' },
        slaves: [{ url: DATABASE_URL, applicationName: 'idempotency-replica' }],
      },
    });
    await replicated.initialize();
    try {
      const [row] = (await statementRunner(replicated)(`SELECT current_setting('application_name') AS app`, [])).records;
      expect(row).toEqual({ app: 'idempotency-primary' });
      const store = new PostgresIdempotencyStore(replicated);
      const key = `replicated:${randomUUID()}`;
      expect(await store.claim({ key, token: 't', fingerprint: '', leaseMs: 60_000 })).toEqual({ status: 'acquired', token: 't' });
      expect(await store.get(key)).toMatchObject({ state: 'processing', token: 't' });
    } finally {
      await replicated.destroy();
    }
  });
});
