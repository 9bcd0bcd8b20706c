import { afterAll, beforeAll, describe, expect, it } from '@jest/globals';
import type { INestApplication } from '@nestjs/common';
import { randomUUID } from 'node:crypto';
import { DataSource } from 'typeorm';
import { createDemoApp, type HttpAdapterName } from '../apps/demo/src/demo-app.factory.js';
import { DATABASE_URL, REDIS_URL } from './support/services.js';

type StoreName = 'redis' | 'memory';
const cases: [HttpAdapterName, StoreName][] = [
  ['express', 'redis'],
  ['express', 'memory'],
  ['fastify', 'redis'],
  ['fastify', 'memory'],
];

describe.each(cases)('POST /orders storm (%s, %s store)', (adapter, store) => {
  let app: INestApplication;
  let baseUrl: string;
  beforeAll(async () => {
    app = await createDemoApp({
      adapter,
      databaseUrl: DATABASE_URL,
      redisUrl: store === 'redis' ? REDIS_URL : undefined,
      keyPrefix: `storm-${randomUUID()}`,
      logger: ['error'],
    });
    await app.listen(0, '127.0.0.1');
    baseUrl = (await app.getUrl()).replace('[::1]', '127.0.0.1');
  });
  afterAll(async () => app.close());

  it('turns 200 concurrent identical requests into exactly one order, answering 201, 409 or a replay', async () => {
    const orderNo = `STORM-${randomUUID()}`;
    const body = JSON.stringify({ orderNo, amount: 12.5 });
    const responses = await Promise.all(
      Array.from({ length: 200 }, () =>
        fetch(`${baseUrl}/orders`, {
          method: 'POST',
          headers: { 'content-type': 'application/json', 'x-user-id': 'storm-user' },
          body,
        }).then(async (res) => ({
          status: res.status,
          replayed: res.headers.get('idempotent-replayed'),
          body: (await res.json()) as { code?: string },
        })),
      ),
    );

    const histogram = { created: 0, replayed: 0, inProgress: 0, other: [] as unknown[] };
    for (const res of responses) {
      if (res.status === 201 && res.replayed === 'true') histogram.replayed++;
      else if (res.status === 201) histogram.created++;
      else if (res.status === 409 && res.body.code === 'IDEMPOTENCY_IN_PROGRESS') histogram.inProgress++;
      else histogram.other.push(res);
    }
    expect(histogram.other).toEqual([]);
    expect(histogram.created).toBe(1);
    const created = responses.find((res) => res.status === 201 && !res.replayed)!.body;
    for (const res of responses.filter((r) => r.replayed)) expect(res.body).toEqual(created);

    const [{ count }] = await app.get(DataSource).query('select count(*)::int as count from orders where order_no = $1', [orderNo]);
    expect(count).toBe(1);
  });
});
