import { afterAll, beforeAll, describe, expect, it } from '@jest/globals';
import { createHash, randomUUID } from 'node:crypto';
import { DataSource } from 'typeorm';
import { IDEMPOTENCY_OUTCOME_MIGRATIONS } from './idempotency-outcomes.migration.js';
import { IDEMPOTENCY_OUTCOME_ENTITIES } from './outcome-record.entity.js';
import type { HeldOutcome, OutcomeClaim } from './outcome-claim.js';
import { PostgresOutcomeRecorder } from './postgres-outcome-recorder.js';
import { dropSchemaDataSource, openSchemaDataSource, testSchemaName } from '../../../../../test/support/test-schema.js';

const sleep = (ms: number) => new Promise<void>((resolve) => setTimeout(resolve, ms));
const hash = (text: string) => createHash('sha256').update(text).digest('hex');

/** Polls `condition` (a state of the database, not a timer) for up to five seconds. */
async function until(condition: () => Promise<boolean>): Promise<void> {
  for (let i = 0; i < 500; i++) {
    if (await condition()) return;
    await sleep(10);
  }
  throw new Error('condition not reached in 5 s');
}

const held = (claim: OutcomeClaim): HeldOutcome => {
  if (claim.status !== 'acquired') throw new Error(`expected acquired, got ${JSON.stringify(claim)}`);
  return claim.held;
};

describe('PostgresOutcomeRecorder', () => {
  const schema = testSchemaName();
  let dataSource: DataSource;
  let recorder: PostgresOutcomeRecorder;
  const rows = async (sql: string, params: unknown[] = []) => dataSource.query(sql, params);
  const table = () => `"${schema}".idempotency_outcomes`;
  const record = async (scope: string) => rows(`SELECT * FROM ${table()} WHERE scope = $1 ORDER BY id`, [scope]);
  const expire = async (scope: string) => rows(`UPDATE ${table()} SET expires_at = now() - interval '1 ms' WHERE scope = $1`, [scope]);
  const newScope = () => `test:${randomUUID()}`;

  beforeAll(async () => {
    dataSource = await openSchemaDataSource(schema, {
      entities: IDEMPOTENCY_OUTCOME_ENTITIES,
      migrations: IDEMPOTENCY_OUTCOME_MIGRATIONS,
      migrationsRun: true,
      extra: { max: 40 },
    });
    await dataSource.query(`CREATE TABLE "${schema}".effects (record_id bigint NOT NULL, note text NOT NULL)`);
    recorder = new PostgresOutcomeRecorder(dataSource);
  });
  afterAll(async () => {
    await dropSchemaDataSource(dataSource);
  });

  describe('migration', () => {
    it('matches the entity exactly: the schema builder finds nothing to change', async () => {
      const pending = await dataSource.driver.createSchemaBuilder().log();
      expect(pending.upQueries.map((query) => query.query)).toEqual([]);
    });

    it('drops the table on the way down and creates it again on the way up', async () => {
      await dataSource.undoLastMigration();
      expect(await rows(`SELECT 1 FROM information_schema.tables WHERE table_schema = $1 AND table_name = 'idempotency_outcomes'`, [schema])).toEqual([]);
      expect(await dataSource.runMigrations()).toHaveLength(1);
      const constraints = await rows(`SELECT conname FROM pg_constraint WHERE conrelid = $1::regclass ORDER BY conname`, [table()]);
      expect(constraints.map((c: { conname: string }) => c.conname)).toEqual([
        'pk_idempotency_outcomes',
        'uq_idempotency_outcomes_content',
        'uq_idempotency_outcomes_request',
      ]);
    });
  });

  describe('two layers: request id, then content hash', () => {
    it('claims a new operation, answers 409-style while it runs, then replays its outcome by either key', async () => {
      const scope = newScope();
      const input = { scope, requestId: 'req-1', contentHash: hash('a') };
      const first = held(await recorder.claim(input));
      expect(first.attempt).toBe(1);
      const running = await recorder.claim(input);
      expect(running).toMatchObject({ status: 'processing', matchedBy: 'request_id' });
      expect(running.status === 'processing' && running.retryAfterMs).toBeGreaterThan(25_000);
      expect(await recorder.claim({ ...input, requestId: 'req-2' })).toMatchObject({ status: 'processing', matchedBy: 'content_hash' });

      expect(await recorder.succeed(first, { statusCode: 201, body: { uploadId: 'u-1', n: [1, null] } })).toBe(true);
      const outcome = { statusCode: 201, body: { uploadId: 'u-1', n: [1, null] } };
      expect(await recorder.claim(input)).toEqual({ status: 'success', matchedBy: 'request_id', recordId: first.recordId, outcome });
      expect(await recorder.claim({ ...input, requestId: 'req-2' })).toEqual({ status: 'success', matchedBy: 'content_hash', recordId: first.recordId, outcome });
      expect(await recorder.claim({ scope, contentHash: hash('a') })).toMatchObject({ status: 'success', matchedBy: 'content_hash' });
      expect(await recorder.claim({ ...input, contentHash: hash('b') })).toEqual({ status: 'mismatch' });
      expect(await record(scope)).toHaveLength(1);
      expect(await recorder.get(scope, { requestId: 'req-1' })).toMatchObject({ state: 'SUCCESS', attempt: 1, outcome });
      expect(await recorder.get(scope, { contentHash: hash('a') })).toMatchObject({ requestId: 'req-1' });
    });

    it('keeps scopes apart: the same keys in another scope are another operation', async () => {
      const input = { scope: newScope(), requestId: 'r', contentHash: hash('scoped') };
      await recorder.succeed(held(await recorder.claim(input)), { statusCode: 201 });
      expect(await recorder.claim({ ...input, scope: newScope() })).toMatchObject({ status: 'acquired' });
    });

    it('works by content alone when no request id is sent', async () => {
      const scope = newScope();
      const claim = held(await recorder.claim({ scope, contentHash: hash('anon') }));
      await recorder.succeed(claim, { statusCode: 201, body: 'ok' });
      expect(await recorder.claim({ scope, contentHash: hash('anon') })).toMatchObject({ status: 'success', outcome: { body: 'ok' } });
      // Two operations without request ids do not collide on the (NULL) request id.
      expect(await recorder.claim({ scope, contentHash: hash('anon-2') })).toMatchObject({ status: 'acquired' });
    });

    it('answers processing, not mismatch, for a request id whose other content is still running', async () => {
      const scope = newScope();
      held(await recorder.claim({ scope, requestId: 'r', contentHash: hash('x') }));
      expect(await recorder.claim({ scope, requestId: 'r', contentHash: hash('y') })).toMatchObject({ status: 'processing', matchedBy: 'request_id' });
    });
  });

  describe('FAILED may run again', () => {
    it('takes a FAILED record over for the same request and content (attempt 2)', async () => {
      const scope = newScope();
      const input = { scope, requestId: 'r', contentHash: hash('f') };
      const first = held(await recorder.claim(input));
      expect(await recorder.fail(first, { statusCode: 400, body: { code: 'INVALID_XML' } })).toBe(true);
      const retry = await recorder.claim(input);
      expect(retry).toMatchObject({ status: 'acquired', previousState: 'FAILED', held: { recordId: first.recordId, attempt: 2 } });
      // The first token no longer holds it.
      expect(await recorder.succeed(first, { statusCode: 201 })).toBe(false);
      expect(await recorder.succeed(held(retry), { statusCode: 201 })).toBe(true);
    });

    it('takes a FAILED record over with corrected content under the same request id', async () => {
      const scope = newScope();
      const broken = held(await recorder.claim({ scope, requestId: 'r', contentHash: hash('<broken') }));
      await recorder.fail(broken, { statusCode: 400 });
      const fixed = await recorder.claim({ scope, requestId: 'r', contentHash: hash('<fixed/>') });
      expect(fixed).toMatchObject({ status: 'acquired', previousState: 'FAILED', held: { recordId: broken.recordId } });
      expect(await record(scope)).toEqual([expect.objectContaining({ request_id: 'r', content_hash: hash('<fixed/>'), state: 'PROCESSING', status_code: null, body: null })]);
      // The broken content is free again.
      expect(await recorder.claim({ scope, requestId: 'r2', contentHash: hash('<broken') })).toEqual({ status: 'acquired', held: expect.objectContaining({ attempt: 1 }) });
    });

    it('takes a FAILED record over through the content layer, carrying the new request id', async () => {
      const scope = newScope();
      const first = held(await recorder.claim({ scope, requestId: 'channel-a', contentHash: hash('doc') }));
      await recorder.fail(first, { statusCode: 500 });
      expect(await recorder.claim({ scope, requestId: 'channel-b', contentHash: hash('doc') })).toMatchObject({ status: 'acquired', previousState: 'FAILED' });
      expect((await record(scope))[0]).toMatchObject({ request_id: 'channel-b', attempt: 2 });
    });

    it('lets the content record decide when the request id failed with other content', async () => {
      const scope = newScope();
      await recorder.fail(held(await recorder.claim({ scope, requestId: 'r1', contentHash: hash('A') })), { statusCode: 400 });
      const other = held(await recorder.claim({ scope, requestId: 'r2', contentHash: hash('B') }));
      await recorder.succeed(other, { statusCode: 201, body: { id: 'B' } });
      expect(await recorder.claim({ scope, requestId: 'r1', contentHash: hash('B') })).toMatchObject({ status: 'success', matchedBy: 'content_hash', outcome: { body: { id: 'B' } } });

      const third = held(await recorder.claim({ scope, requestId: 'r3', contentHash: hash('C') }));
      await recorder.fail(third, { statusCode: 500 });
      const taken = await recorder.claim({ scope, requestId: 'r1', contentHash: hash('C') });
      expect(taken).toMatchObject({ status: 'acquired', previousState: 'FAILED', held: { recordId: third.recordId } });
      // r1 is still the failed record's request id (unique), so the taken-over one keeps r3.
      expect((await record(scope)).map((r: { request_id: string; content_hash: string }) => [r.request_id, r.content_hash])).toEqual([
        ['r1', hash('A')],
        ['r2', hash('B')],
        ['r3', hash('C')],
      ]);
    });
  });

  describe('leases and fencing', () => {
    it('takes over a PROCESSING record whose lease ran out, and refuses the stale owner every write', async () => {
      const scope = newScope();
      const input = { scope, requestId: 'r', contentHash: hash('lease'), leaseMs: 200 };
      const stale = held(await recorder.claim(input));
      expect(await recorder.claim(input)).toMatchObject({ status: 'processing' });
      await until(async () => (await rows(`SELECT expires_at <= now() AS over FROM ${table()} WHERE scope = $1`, [scope]))[0].over);
      const fresh = await recorder.claim({ ...input, leaseMs: 60_000 });
      expect(fresh).toMatchObject({ status: 'acquired', previousState: 'PROCESSING', held: { recordId: stale.recordId, attempt: 2 } });

      let ran = false;
      const late = await recorder.succeedWith(stale, async () => {
        ran = true;
        return { statusCode: 201 };
      });
      expect([late, ran]).toEqual([{ recorded: false }, false]);
      expect(await recorder.succeed(stale, { statusCode: 201, body: 'stale' })).toBe(false);
      expect(await recorder.fail(stale, { statusCode: 500 })).toBe(false);
      expect(await recorder.succeed(held(fresh), { statusCode: 201, body: 'fresh' })).toBe(true);
      expect(await recorder.claim(input)).toMatchObject({ status: 'success', outcome: { body: 'fresh' } });
    });

    it('lets a late owner record while nobody has taken its record over (its token still holds it)', async () => {
      const scope = newScope();
      const late = held(await recorder.claim({ scope, requestId: 'r', contentHash: hash('late'), leaseMs: 100 }));
      await expire(scope);
      expect(await recorder.succeed(late, { statusCode: 201 })).toBe(true);
    });

    it("renews its holder's lease past the original end (by default for the recorder's leaseMs), so a new claim is refused", async () => {
      const scope = newScope();
      const input = { scope, requestId: 'r', contentHash: hash('renew'), leaseMs: 300 };
      const holder = held(await recorder.claim(input));
      const [{ end }] = await rows(`SELECT expires_at::text AS end FROM ${table()} WHERE scope = $1`, [scope]);
      expect(await recorder.renew(holder)).toBe(true);
      await until(async () => (await rows(`SELECT $1::timestamptz <= now() AS over`, [end]))[0].over);
      const repeat = await recorder.claim(input);
      expect(repeat).toMatchObject({ status: 'processing', matchedBy: 'request_id' });
      expect(repeat.status === 'processing' && repeat.retryAfterMs).toBeGreaterThan(25_000);
      expect(await recorder.renew(holder, 60_000)).toBe(true);
      expect((await recorder.get(scope, { requestId: 'r' }))?.ttlMs).toBeGreaterThan(55_000);
      expect(await recorder.succeed(holder, { statusCode: 201 })).toBe(true);
      await expect(recorder.renew(holder, 0)).rejects.toThrow(/leaseMs/);
    });

    it('refuses to renew for an owner whose lease ran out, before and after a take-over', async () => {
      const scope = newScope();
      const input = { scope, requestId: 'r', contentHash: hash('stale-renew'), leaseMs: 60_000 };
      const stale = held(await recorder.claim(input));
      await expire(scope);
      // Nobody claimed again, yet the lease is lost: renewing would revive a claim others may take.
      expect(await recorder.renew(stale)).toBe(false);
      const fresh = await recorder.claim(input);
      expect(fresh).toMatchObject({ status: 'acquired', previousState: 'PROCESSING', held: { recordId: stale.recordId, attempt: 2 } });
      expect(await recorder.renew(stale, 60_000)).toBe(false);
      expect(await recorder.renew(held(fresh), 60_000)).toBe(true);
      expect((await record(scope))[0]).toMatchObject({ state: 'PROCESSING', token: held(fresh).token });
    });

    it('refuses to renew a record already recorded SUCCESS or FAILED, and leaves its retention alone', async () => {
      const scope = newScope();
      const done = held(await recorder.claim({ scope, requestId: 'ok', contentHash: hash('done') }));
      expect(await recorder.succeed(done, { statusCode: 201 })).toBe(true);
      expect(await recorder.renew(done, 1_000)).toBe(false);
      const failed = held(await recorder.claim({ scope, requestId: 'ko', contentHash: hash('failed') }));
      expect(await recorder.fail(failed, { statusCode: 500 })).toBe(true);
      expect(await recorder.renew(failed, 1_000)).toBe(false);
      for (const [requestId, state] of [['ok', 'SUCCESS'], ['ko', 'FAILED']]) {
        const view = await recorder.get(scope, { requestId });
        expect(view?.state).toBe(state);
        expect(view?.ttlMs).toBeGreaterThan(24 * 60 * 60 * 1000);
      }
    });

    it('commits the work and the SUCCESS together, and rolls both back when the work throws', async () => {
      const scope = newScope();
      const input = { scope, requestId: 'r', contentHash: hash('tx') };
      const claim = held(await recorder.claim(input));
      const failing = recorder.succeedWith(claim, async (manager) => {
        await manager.query(`INSERT INTO "${schema}".effects VALUES ($1, 'rolled back')`, [claim.recordId]);
        throw new Error('boom');
      });
      await expect(failing).rejects.toThrow('boom');
      expect((await record(scope))[0].state).toBe('PROCESSING');
      const done = await recorder.succeedWith(claim, async (manager) => {
        await manager.query(`INSERT INTO "${schema}".effects VALUES ($1, 'kept')`, [claim.recordId]);
        return { statusCode: 201, body: { ok: true } };
      });
      expect(done).toEqual({ recorded: true, outcome: { statusCode: 201, body: { ok: true } } });
      expect(await rows(`SELECT note FROM "${schema}".effects WHERE record_id = $1`, [claim.recordId])).toEqual([{ note: 'kept' }]);
    });

    it('makes a claim arriving during the fenced work wait for it, then replay its outcome', async () => {
      const scope = newScope();
      const input = { scope, requestId: 'r', contentHash: hash('wait'), leaseMs: 100 };
      const claim = held(await recorder.claim(input));
      let open!: () => void;
      const gate = new Promise<void>((resolve) => (open = resolve));
      const work = recorder.succeedWith(claim, async () => {
        await gate;
        return { statusCode: 201, body: 'first' };
      });
      // The lease runs out while the owner holds the row lock: a new claim must not take over.
      await until(async () => (await rows(`SELECT expires_at <= now() AS over FROM ${table()} WHERE scope = $1`, [scope]))[0].over);
      const repeat = recorder.claim(input);
      await until(async () => (await rows(`SELECT count(*)::int AS n FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND query LIKE $1`, [`%${schema}%FOR UPDATE%`]))[0].n > 0);
      open();
      expect(await work).toMatchObject({ recorded: true });
      expect(await repeat).toMatchObject({ status: 'success', outcome: { body: 'first' } });
    });
  });

  describe('concurrency', () => {
    it.each([
      ['the same request id and content', (i: number) => ({ requestId: 'same', contentHash: hash('storm') , i })],
      ['another request id each, the same content', (i: number) => ({ requestId: `r-${i}`, contentHash: hash('storm'), i })],
    ])('gives one of 40 concurrent claims with %s the operation', async (_what, make) => {
      const scope = newScope();
      const claims = await Promise.all(Array.from({ length: 40 }, (_, i) => recorder.claim({ scope, ...make(i) })));
      expect(claims.filter((c) => c.status === 'acquired')).toHaveLength(1);
      expect(claims.filter((c) => c.status === 'processing')).toHaveLength(39);
      expect(await record(scope)).toHaveLength(1);
    });

    it('gives a FAILED record to exactly one of 40 concurrent retries', async () => {
      const scope = newScope();
      await recorder.fail(held(await recorder.claim({ scope, requestId: 'r', contentHash: hash('retry') })), { statusCode: 500 });
      const claims = await Promise.all(
        Array.from({ length: 40 }, (_, i) => recorder.claim({ scope, requestId: i % 2 ? 'r' : `other-${i}`, contentHash: hash('retry') })),
      );
      expect(claims.filter((c) => c.status === 'acquired')).toEqual([expect.objectContaining({ previousState: 'FAILED' })]);
      expect(await record(scope)).toHaveLength(1);
    });

    it('answers crossing claims (request id of one record, content of another) without error', async () => {
      const scope = newScope();
      for (const [r, c] of [['A', 'h1'], ['B', 'h2']]) {
        await recorder.fail(held(await recorder.claim({ scope, requestId: r, contentHash: hash(c) })), { statusCode: 500 });
      }
      const claims = await Promise.all(
        Array.from({ length: 30 }, (_, i) => recorder.claim({ scope, requestId: i % 2 ? 'A' : 'B', contentHash: hash(i % 2 ? 'h2' : 'h1') })),
      );
      // Each record is taken over once at most; the rest wait for it.
      const acquired = claims.filter((c) => c.status === 'acquired');
      expect(acquired.length).toBeGreaterThanOrEqual(1);
      expect(acquired.length).toBeLessThanOrEqual(2);
      expect(new Set(acquired.map((c) => held(c).recordId)).size).toBe(acquired.length);
      expect(await record(scope)).toHaveLength(2);
    });
  });

  describe('retention', () => {
    it('stops recognising a record after its retention and takes it over as new work', async () => {
      const short = new PostgresOutcomeRecorder(dataSource, { retentionMs: 150 });
      const scope = newScope();
      const input = { scope, requestId: 'r', contentHash: hash('old') };
      await short.succeed(held(await short.claim(input)), { statusCode: 201, body: 'old' });
      expect(await short.claim(input)).toMatchObject({ status: 'success' });
      await until(async () => (await rows(`SELECT expires_at <= now() AS over FROM ${table()} WHERE scope = $1`, [scope]))[0].over);
      expect(await short.get(scope, { requestId: 'r' })).toBeUndefined();
      expect(await short.claim(input)).toMatchObject({ status: 'acquired', previousState: 'SUCCESS', held: { attempt: 2 } });
    });

    // An adversarial helper: the retention was counted from the start of succeedWith's
    // transaction (now()), so a work of 2 s under a 3 s retention left a record recognised for
    // ~1 s, and a repeat 1.2 s after the commit ran the work again (5 of 5 keys).
    it("counts a succeedWith record's retention from when it was recorded, not from when its work began", async () => {
      const short = new PostgresOutcomeRecorder(dataSource, { retentionMs: 3000 });
      const scope = newScope();
      const input = { scope, requestId: 'r', contentHash: hash('slow') };
      await short.succeedWith(held(await short.claim(input)), async () => {
        await sleep(1500);
        return { statusCode: 201, body: 'done' };
      });
      expect((await short.get(scope, { requestId: 'r' }))!.ttlMs).toBeGreaterThan(2500);
    });

    // An adversarial helper: the purge deleted a PROCESSING record the moment its lease ran out,
    // so its late owner could no longer record, and a repeat acquired a new record and ran the
    // work again (10 of 10 keys with a 100 ms purge timer).
    it("keeps an expired claim for keepExpiredClaimsMs, so that its late owner still records and a repeat replays", async () => {
      const scope = newScope();
      const input = { scope, requestId: 'late', contentHash: hash('late') };
      const late = held(await recorder.claim({ ...input, leaseMs: 100 }));
      await until(async () => (await rows(`SELECT expires_at <= now() AS over FROM ${table()} WHERE scope = $1`, [scope]))[0].over);
      await recorder.purgeExpired();
      expect(await recorder.succeed(late, { statusCode: 201, body: 'late' })).toBe(true);
      expect(await recorder.claim(input)).toMatchObject({ status: 'success', outcome: { body: 'late' } });

      const other = newScope();
      await recorder.claim({ scope: other, requestId: 'gone', contentHash: hash('gone'), leaseMs: 100 });
      await until(async () => (await rows(`SELECT expires_at <= now() AS over FROM ${table()} WHERE scope = $1`, [other]))[0].over);
      await new PostgresOutcomeRecorder(dataSource, { keepExpiredClaimsMs: 50 }).purgeExpired();
      await sleep(100);
      await new PostgresOutcomeRecorder(dataSource, { keepExpiredClaimsMs: 50 }).purgeExpired();
      expect(await record(other)).toEqual([]);
    });

    it('purges expired records in batches and keeps live ones', async () => {
      const scope = newScope();
      for (let i = 0; i < 5; i++) await recorder.claim({ scope, requestId: `old-${i}`, contentHash: hash(`old-${i}`) });
      await expire(scope);
      await recorder.claim({ scope, requestId: 'live', contentHash: hash('live') });
      const batched = new PostgresOutcomeRecorder(dataSource, { purgeBatchSize: 2, keepExpiredClaimsMs: 0 });
      expect(await batched.purgeExpired()).toBeGreaterThanOrEqual(5);
      expect((await record(scope)).map((r: { request_id: string }) => r.request_id)).toEqual(['live']);
    });

    it("purges on an unref'd timer between onModuleInit and onApplicationShutdown", async () => {
      const timed = new PostgresOutcomeRecorder(dataSource, { purgeIntervalMs: 50, keepExpiredClaimsMs: 0 });
      const scope = newScope();
      await timed.claim({ scope, requestId: 'r', contentHash: hash('timer') });
      await expire(scope);
      timed.onModuleInit();
      expect((timed as unknown as { purgeSchedule: { timer: NodeJS.Timeout } }).purgeSchedule.timer.hasRef()).toBe(false);
      await until(async () => (await record(scope)).length === 0);
      await timed.onApplicationShutdown();
    });
  });

  // An adversarial helper: a scope or request id over 255 characters, a NUL, a hash over 64
  // characters failed in the database (IdempotencyStoreError, answered as an outage); a hash in
  // capitals made the same bytes a second record; '' was kept as a request id; a fractional
  // statusCode failed the recording. Refused before any statement now.
  it.each([
    ['a scope over 255 characters', { scope: 's'.repeat(256) }],
    ['a scope with a NUL', { scope: 'a\0b' }],
    ['an empty scope', { scope: '' }],
    ['an empty request id', { requestId: '' }],
    ['a request id with a lone surrogate', { requestId: 'a\ud800' }],
    ['a request id over 255 characters', { requestId: 'r'.repeat(256) }],
    ['a hash in capitals', { contentHash: hash('x').toUpperCase() }],
    ['a hash that is not hex', { contentHash: 'z'.repeat(64) }],
    ['a hash over 64 characters', { contentHash: hash('x') + '0' }],
    ['a bigint scope', { scope: 1n }],
    ['a bigint request id', { requestId: 5n }],
  ])('refuses a claim with %s before any statement (RangeError)', async (_what, change) => {
    const scope = newScope();
    await expect(recorder.claim({ scope, requestId: 'r', contentHash: hash('x'), ...change } as never)).rejects.toThrow(RangeError);
    expect(await record(scope)).toEqual([]);
  });

  // An adversarial helper: a bad leaseMs threw out of the call, past the caller's .catch().
  it('rejects a claim with a leaseMs that is not a positive number of milliseconds (a promise, never a throw)', async () => {
    for (const leaseMs of [0, -5, NaN, '2000', Infinity]) {
      const claimed = (() => {
        try {
          return recorder.claim({ scope: newScope(), requestId: 'r', contentHash: hash('lease'), leaseMs: leaseMs as number });
        } catch (error) {
          return `thrown: ${(error as Error).message}`;
        }
      })();
      expect(claimed).toBeInstanceOf(Promise);
      await expect(claimed).rejects.toThrow(/leaseMs/);
    }
  });

  it('refuses to record a statusCode that is not an integer from 100 to 999, and the work of succeedWith with it rolls back', async () => {
    const scope = newScope();
    const claim = held(await recorder.claim({ scope, requestId: 'r', contentHash: hash('status') }));
    await expect(recorder.succeed(claim, { statusCode: 201.5 })).rejects.toThrow(RangeError);
    await expect(recorder.succeed(claim, { statusCode: 201n as unknown as number })).rejects.toThrow(RangeError);
    await expect(
      recorder.succeedWith(claim, async (manager) => {
        await manager.query(`INSERT INTO "${schema}".effects (record_id, note) VALUES ($1, 'status')`, [claim.recordId]);
        return { statusCode: '201' as unknown as number };
      }),
    ).rejects.toThrow(RangeError);
    expect(await rows(`SELECT * FROM "${schema}".effects WHERE record_id = $1`, [claim.recordId])).toEqual([]);
    expect(await recorder.succeed(claim, { statusCode: 201 })).toBe(true);
  });

  it('refuses a DataSource that is not PostgreSQL and durations that are not positive', () => {
    expect(() => new PostgresOutcomeRecorder({ options: { type: 'mysql' } } as DataSource)).toThrow(/postgres DataSource/);
    expect(() => new PostgresOutcomeRecorder(dataSource, { retentionMs: 0 })).toThrow(/retentionMs/);
  });
});

// Sessions that default to a stricter isolation: `succeedWith`'s lock of the record waited for
// a concurrent update of it (the owner's own renewal, as a heartbeat sends it) and then failed
// with 40001, as its snapshot predates that update; the work had not run. It runs again now.
describe.each(['serializable', 'repeatable read'])('PostgresOutcomeRecorder on sessions that default to %s', (isolation) => {
  const schema = testSchemaName();
  let dataSource: DataSource;
  let recorder: PostgresOutcomeRecorder;
  beforeAll(async () => {
    dataSource = await openSchemaDataSource(schema, {
      entities: IDEMPOTENCY_OUTCOME_ENTITIES,
      migrations: IDEMPOTENCY_OUTCOME_MIGRATIONS,
      migrationsRun: true,
      extra: { max: 10, options: `-c default_transaction_isolation=${isolation.replace(' ', '\\ ')}` },
    });
    await dataSource.query(`CREATE TABLE "${schema}".effects (record_id bigint NOT NULL)`);
    recorder = new PostgresOutcomeRecorder(dataSource);
  });
  afterAll(async () => {
    await dropSchemaDataSource(dataSource);
  });

  it('records the work once when the record was updated while succeedWith waited for its lock', async () => {
    expect(await dataSource.query('SHOW default_transaction_isolation')).toEqual([{ default_transaction_isolation: isolation }]);
    const claim = held(await recorder.claim({ scope: `test:${randomUUID()}`, requestId: 'r', contentHash: hash('serial') }));
    const renewal = dataSource.createQueryRunner();
    await renewal.startTransaction();
    await renewal.query(`UPDATE "${schema}".idempotency_outcomes SET expires_at = expires_at + interval '1 s' WHERE id = $1`, [claim.recordId]);
    let runs = 0;
    const done = recorder.succeedWith(claim, async (manager) => {
      runs++;
      await manager.query(`INSERT INTO "${schema}".effects VALUES ($1)`, [claim.recordId]);
      return { statusCode: 201, body: { ok: true } };
    });
    await until(
      async () =>
        (await dataSource.query(`SELECT count(*)::int AS n FROM pg_stat_activity WHERE wait_event_type = 'Lock' AND query LIKE $1`, [`%${schema}%FOR UPDATE%`]))[0]
          .n > 0,
    );
    await renewal.commitTransaction();
    await renewal.release();
    // Observed before: rejected with "could not serialize access due to concurrent update".
    const settled = await done.then((value) => value, (error: Error) => error.message);
    const effects = await dataSource.query(`SELECT count(*)::int AS n FROM "${schema}".effects WHERE record_id = $1`, [claim.recordId]);
    expect({ settled, runs, effects: effects[0].n }).toEqual({ settled: { recorded: true, outcome: { statusCode: 201, body: { ok: true } } }, runs: 1, effects: 1 });
  });
});
