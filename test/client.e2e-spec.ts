import { afterAll, beforeAll, describe, expect, it } from '@jest/globals';
import { randomUUID } from 'node:crypto';
import { DataSource } from 'typeorm';
import type { HttpAdapterName } from '../apps/demo/src/demo-app.factory.js';
import { createIdempotentClient, type IdempotentClient } from '../libs/idempotency-client/src/index.js';
import { listenDemo, type ListeningDemo } from './support/demo-server.js';
import { DATABASE_URL, REDIS_URL } from './support/services.js';
import { TcpProxy } from './support/tcp-proxy.js';

/** The demo's POST /orders takes its key from the body (`#body.orderNo`): the client sends no key header. */
describe.each<HttpAdapterName>(['express', 'fastify'])('the idempotent client on the demo POST /orders (%s)', (adapter) => {
  let demo: ListeningDemo;
  let proxy: TcpProxy;
  const clientAs = (user: string): IdempotentClient =>
    createIdempotentClient({
      baseUrl: `http://127.0.0.1:${proxy.port}`,
      keyHeader: false,
      headers: { 'x-user-id': user },
      backoff: { baseMs: 20, maxMs: 200, jitter: 0.5 },
      timeoutMs: 10_000,
    });
  const ordersWith = async (orderNo: string): Promise<number> => {
    const [{ count }] = await demo.app
      .get(DataSource)
      .query('select count(*)::int as count from orders where order_no = $1', [orderNo]);
    return count as number;
  };

  beforeAll(async () => {
    demo = await listenDemo({ adapter, databaseUrl: DATABASE_URL, redisUrl: REDIS_URL, keyPrefix: `client-e2e-${randomUUID()}` });
    proxy = await new TcpProxy({ host: '127.0.0.1', port: Number(new URL(demo.baseUrl).port) }).start();
  });
  afterAll(async () => {
    await proxy?.stop();
    await demo?.app.close();
  });

  it('retries a connection cut after the server committed and gets the replay: one order', async () => {
    const orderNo = `CLIENT-${randomUUID()}`;
    proxy.dropNextResponse();
    const res = await clientAs('client-e2e').post<{ orderNo: string; status: string }>('/orders', { orderNo, amount: 12.5 });

    expect(proxy.droppedResponses).toBe(1);
    expect(res).toMatchObject({ status: 201, replayed: true, attempts: 2, key: undefined });
    expect(res.body).toMatchObject({ orderNo, status: 'PENDING', userId: 'client-e2e' });
    expect(await ordersWith(orderNo)).toBe(1);
  });

  it('creates on the first attempt, and the same operation again is a replay', async () => {
    const orderNo = `CLIENT-${randomUUID()}`;
    const client = clientAs('client-e2e');
    const first = await client.post('/orders', { orderNo, amount: 3 });
    const again = await client.post('/orders', { orderNo, amount: 3 });
    expect(first).toMatchObject({ status: 201, replayed: false, attempts: 1 });
    expect(again).toMatchObject({ status: 201, replayed: true, attempts: 1, body: first.body });
    expect(await ordersWith(orderNo)).toBe(1);
  });

  it('returns final answers at once: 400, 422 (key reused with another payload), 409 without Retry-After', async () => {
    const orderNo = `CLIENT-${randomUUID()}`;
    const client = clientAs('client-e2e');
    const invalid = await client.post('/orders', { orderNo, amount: -1 });
    expect(invalid).toMatchObject({ status: 400, attempts: 1, body: { code: 'VALIDATION_FAILED' } });

    await client.post('/orders', { orderNo, amount: 3 });
    const reused = await client.post('/orders', { orderNo, amount: 4 });
    expect(reused).toMatchObject({ status: 422, attempts: 1, body: { code: 'IDEMPOTENCY_KEY_REUSED' } });

    const otherUser = await clientAs('client-e2e-other').post('/orders', { orderNo, amount: 3 });
    expect(otherUser).toMatchObject({ status: 409, attempts: 1, body: { code: 'ORDER_EXISTS' } });
    expect(otherUser.headers.get('retry-after')).toBeNull();
    expect(await ordersWith(orderNo)).toBe(1);
  });
});
