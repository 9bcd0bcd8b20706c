import { afterAll, beforeAll, describe, expect, it } from '@jest/globals';
import type { INestApplication } from '@nestjs/common';
import { randomUUID } from 'node:crypto';
import request from 'supertest';
import { DataSource } from 'typeorm';
import { createDemoApp, type HttpAdapterName } from '../apps/demo/src/demo-app.factory.js';
import { IdempotencyCounters } from '../libs/idempotency/src/index.js';
import { listenDemo, postJson, type FetchedAnswer } from './support/demo-server.js';
import { startRedisServer, type RedisServer } from './support/redis-server.js';
import { DATABASE_URL, REDIS_URL } from './support/services.js';

/**
 * The database behind the idempotency guard: when a retry gets past the guard (the store is down
 * and the route fails open, or the record expired), the unique index on orders.order_no and
 * `insertOnce` still make it one order, and the retry gets that order back with 200.
 */
const countOrders = async (app: INestApplication, orderNo: string): Promise<number> =>
  (await app.get(DataSource).query('select count(*)::int as n from orders where order_no = $1', [orderNo]))[0].n;

describe.each<HttpAdapterName>(['express', 'fastify'])('orders: the database behind the guard (%s)', (adapter) => {
  describe('two instances whose guards share no records', () => {
    // Same Redis, different key prefixes: to each guard the other's requests never happened,
    // exactly as for a retry after the record expired or while the store was down.
    let a: INestApplication;
    let b: INestApplication;
    beforeAll(async () => {
      const options = { adapter, databaseUrl: DATABASE_URL, redisUrl: REDIS_URL, logger: ['error' as const] };
      a = await createDemoApp({ ...options, keyPrefix: `backstop-a-${randomUUID()}` });
      b = await createDemoApp({ ...options, keyPrefix: `backstop-b-${randomUUID()}` });
    });
    afterAll(async () => {
      await a?.close();
      await b?.close();
    });

    const post = (app: INestApplication, body: object, userId: string) =>
      request(app.getHttpServer()).post('/orders').set('X-User-Id', userId).send(body);

    it('answers 201 then 200 with the same order and keeps one row; each guard replays its own status', async () => {
      const body = { orderNo: `BACKSTOP-${randomUUID()}`, amount: 12.5 };
      const created = await post(a, body, 'alice');
      expect(created.status).toBe(201);
      const existing = await post(b, body, 'alice');
      expect(existing.status).toBe(200);
      expect(existing.headers['idempotent-replayed']).toBeUndefined();
      expect(existing.body).toEqual(created.body);

      // The guards saved the status each handler set (201, 200) and replay it.
      const replayB = await post(b, body, 'alice');
      expect([replayB.status, replayB.headers['idempotent-replayed']]).toEqual([200, 'true']);
      expect(replayB.body).toEqual(created.body);
      const replayA = await post(a, body, 'alice');
      expect([replayA.status, replayA.headers['idempotent-replayed']]).toEqual([201, 'true']);
      expect(replayA.body).toEqual(created.body);

      expect(await countOrders(a, body.orderNo)).toBe(1);
    });

    it('answers 409 ORDER_EXISTS, without the order, to another user and to the same user with another amount', async () => {
      const orderNo = `BACKSTOP-${randomUUID()}`;
      const created = await post(a, { orderNo, amount: 10 }, 'alice');
      expect(created.status).toBe(201);
      const conflict = {
        statusCode: 409,
        error: 'Conflict',
        code: 'ORDER_EXISTS',
        message: 'An order with this orderNo already exists.',
      };
      const otherUser = await post(b, { orderNo, amount: 10 }, 'bob');
      expect([otherUser.status, otherUser.body]).toEqual([409, conflict]);
      const otherAmount = await post(b, { orderNo, amount: 11 }, 'alice');
      expect([otherAmount.status, otherAmount.body]).toEqual([409, conflict]);
      expect(await countOrders(a, orderNo)).toBe(1);
    });
  });

  describe('a storm while the Redis store is killed', () => {
    let redis: RedisServer;
    let app: INestApplication;
    let baseUrl: string;
    beforeAll(async () => {
      redis = await startRedisServer();
      ({ app, baseUrl } = await listenDemo({
        adapter,
        databaseUrl: DATABASE_URL,
        redisUrl: redis.url,
        keyPrefix: `backstop-storm-${randomUUID()}`,
        // The guard warns once per request that runs unguarded: hundreds of lines.
        logger: false,
      }));
    });
    afterAll(async () => {
      await app?.close();
      await redis?.kill();
    });

    it('keeps one order and answers no 5xx when the store dies with 200 identical requests in flight', async () => {
      const orderNo = `FAILOPEN-${randomUUID()}`;
      let killed: Promise<void> | undefined;
      const answers = await Promise.all(
        Array.from({ length: 200 }, () =>
          postJson(`${baseUrl}/orders`, { orderNo, amount: 12.5 }, { 'x-user-id': 'storm-user' }).then((answer) => {
            // The first answer kills Redis: the requests still in flight meet the outage.
            killed ??= redis.kill();
            return answer;
          }),
        ),
      );
      await killed;

      const histogram = { created: 0, existing: 0, replayed: 0, inProgress: 0, other: [] as FetchedAnswer[] };
      for (const answer of answers) {
        if (answer.status === 201 && !answer.replayed) histogram.created++;
        else if (answer.status === 200 && !answer.replayed) histogram.existing++;
        // A replay of the 201, or (had a guarded request found the row) of a 200.
        else if ((answer.status === 201 || answer.status === 200) && answer.replayed === 'true') histogram.replayed++;
        else if (answer.status === 409 && answer.body.code === 'IDEMPOTENCY_IN_PROGRESS') histogram.inProgress++;
        else histogram.other.push(answer);
      }
      expect(histogram.other).toEqual([]);
      expect(histogram.created).toBe(1);
      const order = answers.find((answer) => answer.status === 201 && !answer.replayed)!.body;
      for (const answer of answers.filter((a) => a.status !== 409)) expect(answer.body).toEqual(order);
      expect(await countOrders(app, orderNo)).toBe(1);

      // The outage really happened mid-storm: some requests ran unguarded, and the database
      // answered them with the existing order.
      const counters = app.get(IdempotencyCounters);
      expect(counters.failOpen).toBeGreaterThan(0);
      expect(histogram.existing).toBeGreaterThan(0);
    });
  });
});
