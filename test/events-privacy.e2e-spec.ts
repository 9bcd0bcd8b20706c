// "events carry the SHA-256 of the storage key, never the client key. A key may be a
// business value (an order number, an e-mail address in `#body.email`)" (README, Events). The
// `store_error` event's `error` is part of the event: a listener (audit log, OpenTelemetry's
// recordException, pino's err serializer) writes it out. It must not carry the client key, nor
// the saved body.
import { afterAll, beforeAll, describe, expect, it } from '@jest/globals';
import { Body, Controller, Injectable, Post } from '@nestjs/common';
import { Redis } from 'ioredis';
import { randomUUID } from 'node:crypto';
import { inspect } from 'node:util';
import { NoRepeatSubmit, type IdempotencyEvent } from '../libs/idempotency/src/index.js';
import { makeApp, raw, until, type EdgeApp } from './support/edge-app.js';
import pg from 'pg';
import type { DataSource } from 'typeorm';
import { IDEMPOTENCY_ENTITIES, IDEMPOTENCY_MIGRATIONS, PostgresIdempotencyStore } from '../libs/idempotency/src/typeorm/index.js';
import { startRedisServer, type RedisServer } from './support/redis-server.js';
import { DATABASE_URL, REDIS_URL } from './support/services.js';
import { dropSchemaDataSource, openSchemaDataSource, testSchemaName } from './support/test-schema.js';

@Injectable()
class Hook {
  beforeAnswer: () => Promise<void> = async () => undefined;
}

@Controller('signup')
class SignupController {
  constructor(private readonly hook: Hook) {}

  @Post()
  @NoRepeatSubmit({ idempotentKey: '#body.email' })
  async create(@Body() body: { email: string; card: string }) {
    await this.hook.beforeAnswer();
    return { welcome: body.email, card: body.card };
  }
}

/** Everything a listener that logs the event would write: the error, its cause, their own properties. */
const written = (event: IdempotencyEvent) => inspect(event, { depth: 10, showHidden: false });

describe('store_error events carry no client key (Redis, waitForReplicas with a replica short)', () => {
  let edge: EdgeApp;
  const seen: IdempotencyEvent[] = [];

  beforeAll(async () => {
    edge = await makeApp(
      'express',
      [SignupController],
      {
        // A standalone primary whose replica is away: WAIT says 0 of 1.
        store: { redis: REDIS_URL, waitForReplicas: { replicas: 1, timeoutMs: 20 } },
        keyPrefix: `rv-privacy-${randomUUID().slice(0, 8)}`,
        onEvent: (event) => void seen.push(event),
      },
      { providers: [Hook], setup: (app) => app.useLogger(false) },
    );
  });
  afterAll(async () => edge?.close());

  it('reports the failed claim without the e-mail address that keys it', async () => {
    const email = `jane.doe+${randomUUID().slice(0, 6)}@example.com`;
    const answer = await raw(edge.url, '/signup', { body: { email, card: '4111111111111111' } }).answer;
    expect(answer.status).toBe(201); // fail-open: it ran unguarded
    const errors = seen.filter((event) => event.type === 'store_error');
    expect(errors.length).toBeGreaterThanOrEqual(1);
    for (const event of errors) {
      // Before the fix: "Only 0 of 1 replicas acknowledged rv-privacy-…:anon::SignupController.create:jane.doe%2B…%40example.com within 20 ms"
      expect(written(event)).not.toContain(encodeURIComponent(email));
      expect(written(event)).not.toContain(email);
    }
  });
});

describe('store_error events carry no client key nor saved body (Redis refuses the save script)', () => {
  let server: RedisServer;
  let admin: Redis;
  let edge: EdgeApp;
  const seen: IdempotencyEvent[] = [];

  beforeAll(async () => {
    server = await startRedisServer();
    admin = new Redis(server.url, { maxRetriesPerRequest: 0 });
    edge = await makeApp(
      'express',
      [SignupController],
      { store: { redis: server.url }, keyPrefix: 'rv-privacy-oom', onEvent: (event) => void seen.push(event) },
      { providers: [Hook], setup: (app) => app.useLogger(false) },
    );
  });
  afterAll(async () => {
    await edge?.close();
    admin?.disconnect();
    await server?.kill();
  });

  it('reports the failed save without the e-mail address nor the card number of the answer', async () => {
    const email = `john.roe+${randomUUID().slice(0, 6)}@example.com`;
    const card = '5500005555555559';
    // Redis refuses the save while the handler runs: its user's ACL denies scripts (NOPERM). (It
    // was out of memory until a running claim's save became allowed at maxmemory.)
    edge.app.get(Hook).beforeAnswer = async () => void (await admin.call('ACL', 'SETUSER', 'default', '-evalsha', '-eval'));
    const answer = await raw(edge.url, '/signup', { body: { email, card } }).answer;
    expect(answer.status).toBe(201);
    await until(() => seen.some((event) => event.type === 'store_error' && event.operation === 'complete'));
    const failed = seen.find((event) => event.type === 'store_error' && event.operation === 'complete')!;
    expect(String((failed as { error: Error }).error.message)).toMatch(/NOPERM/);
    // Before the fix: error.cause (ioredis ReplyError).command.args = [storage key, token, '[201,{…}]\n{"welcome":"john.roe…","card":"5500…"}', …]
    expect(written(failed)).not.toContain(encodeURIComponent(email));
    expect(written(failed)).not.toContain(card);
  });
});

describe('store_error events carry no client key nor saved body (PostgreSQL, the save hits statement_timeout)', () => {
  let ds: DataSource;
  let edge: EdgeApp;
  const seen: IdempotencyEvent[] = [];

  beforeAll(async () => {
    ds = await openSchemaDataSource(testSchemaName(), {
      entities: IDEMPOTENCY_ENTITIES,
      migrations: IDEMPOTENCY_MIGRATIONS,
      migrationsRun: true,
      extra: { statement_timeout: 200 },
    });
    edge = await makeApp(
      'fastify',
      [SignupController],
      { store: new PostgresIdempotencyStore(ds), keyPrefix: 'rv-privacy-pg', onEvent: (event) => void seen.push(event) },
      { providers: [Hook], setup: (app) => app.useLogger(false) },
    );
  });
  afterAll(async () => {
    await edge?.close();
    await dropSchemaDataSource(ds);
  });

  it('reports the failed save without the e-mail address nor the card number of the answer', async () => {
    const email = `max.mustermann+${randomUUID().slice(0, 6)}@example.com`;
    const card = '4000056655665556';
    const { schema } = ds.options as { schema: string };
    // A migration (or a VACUUM FULL) holds the table while the handler runs: the save times out.
    const admin = new pg.Client({ connectionString: DATABASE_URL });
    await admin.connect();
    edge.app.get(Hook).beforeAnswer = async () => {
      await admin.query('BEGIN');
      await admin.query(`LOCK TABLE "${schema}".idempotency_records IN ACCESS EXCLUSIVE MODE`);
    };
    try {
      const answer = await raw(edge.url, '/signup', { body: { email, card } }).answer;
      expect(answer.status).toBe(201);
      await until(() => seen.some((event) => event.type === 'store_error' && event.operation === 'complete'), 5000);
    } finally {
      await admin.query('ROLLBACK');
      await admin.end();
    }
    const failed = seen.find((event) => event.type === 'store_error' && event.operation === 'complete')!;
    expect(String((failed as { error: Error }).error.message)).toMatch(/statement timeout/);
    // Before the fix: error.cause (typeorm QueryFailedError).parameters = [storage key, …, the saved body]
    expect(written(failed)).not.toContain(encodeURIComponent(email));
    expect(written(failed)).not.toContain(card);
  });
});
