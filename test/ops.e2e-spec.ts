import { afterAll, beforeAll, describe, expect, it } from '@jest/globals';
import type { INestApplication } from '@nestjs/common';
import { randomUUID } from 'node:crypto';
import request from 'supertest';
import { createDemoApp, type HttpAdapterName } from '../apps/demo/src/demo-app.factory.js';
import { freePort, startRedisServer } from './support/redis-server.js';
import { DATABASE_URL, REDIS_URL } from './support/services.js';

describe.each<HttpAdapterName>(['express', 'fastify'])('what the demo shows operators (%s)', (adapter) => {
  let app: INestApplication;
  beforeAll(async () => {
    app = await createDemoApp({ adapter, databaseUrl: DATABASE_URL, redisUrl: REDIS_URL, keyPrefix: `ops-${randomUUID()}`, logger: ['error'] });
  });
  afterAll(async () => app.close());

  it('documents the guard on every decorated operation in OpenAPI, with no extra decorator', async () => {
    const docs = await request(app.getHttpServer()).get('/docs-json').expect(200);
    const createOrder = docs.body.paths['/orders'].post;
    expect(Object.keys(createOrder.responses)).toEqual(expect.arrayContaining(['400', '409', '422']));
    expect(createOrder.responses['409'].description).toMatch(/IDEMPOTENCY_IN_PROGRESS/);
    expect(createOrder.responses['409'].headers).toHaveProperty('Retry-After');
    expect(createOrder.responses['422'].description).toMatch(/IDEMPOTENCY_KEY_REUSED/);
    expect(createOrder.responses['400'].description).toContain('the body field "orderNo"');
    expect(docs.body.paths['/orders/{orderNo}'].get.responses['409']).toBeUndefined();
    const page = await request(app.getHttpServer()).get('/docs').redirects(1);
    expect(page.status).toBe(200);
    expect(page.text).toMatch(/swagger/i);
  });

  it('counts outcomes per handler on /metrics', async () => {
    const orderNo = `OPS-${randomUUID().slice(0, 8)}`;
    for (let i = 0; i < 2; i++) {
      await request(app.getHttpServer()).post('/orders').set('x-user-id', 'ops').send({ orderNo, amount: 1 });
    }
    const metrics = await request(app.getHttpServer()).get('/metrics').expect(200);
    expect(metrics.headers['content-type']).toMatch(/^text\/plain/);
    expect(metrics.text).toMatch(/idempotency_requests_total\{handler="OrdersController.create",outcome="acquired"\} [1-9]/);
    expect(metrics.text).toMatch(/idempotency_requests_total\{handler="OrdersController.create",outcome="replayed"\} [1-9]/);
    expect(metrics.text).toMatch(/idempotency_store_duration_seconds_count\{operation="claim"\} [1-9]/);
  });

  it('reports the store and the database on /health', async () => {
    const health = await request(app.getHttpServer()).get('/health').expect(200);
    expect(health.body).toMatchObject({
      status: 'ok',
      info: { idempotency: { status: 'up', store: 'RedisIdempotencyStore' }, database: { status: 'up' } },
    });
  });

  // An adversarial helper: a Redis that answers PING but refuses every write (a replica after a
  // failover, READONLY; maxmemory under noeviction, OOM) was "up", while every claim failed and
  // fail-open routes ran unguarded: duplicates ran twice. The check claims and frees a probe key.
  it('answers 503 on /health when the store answers but refuses writes (a read-only replica)', async () => {
    const replica = await startRedisServer(undefined, ['--replicaof', '127.0.0.1', String(await freePort()), '--replica-read-only', 'yes']);
    const readOnly = await createDemoApp({ adapter, databaseUrl: DATABASE_URL, redisUrl: replica.url, keyPrefix: `ops-ro-${randomUUID()}`, logger: false });
    try {
      // Until the store's connection is ready, /health is down for that: wait for its answer on a ready one.
      let health = await request(readOnly.getHttpServer()).get('/health');
      for (let i = 0; i < 50 && /writeable|connect/i.test(String(health.body.error?.idempotency?.message)); i++) {
        await new Promise((resolve) => setTimeout(resolve, 100));
        health = await request(readOnly.getHttpServer()).get('/health');
      }
      expect(health.status).toBe(503);
      expect(health.body.error.idempotency).toMatchObject({ status: 'down', store: 'RedisIdempotencyStore' });
      expect(health.body.error.idempotency.message).toMatch(/READONLY/);
    } finally {
      await readOnly.close();
      await replica.kill();
    }
  });

  it('answers 503 on /health when the store is down', async () => {
    const down = await createDemoApp({
      adapter,
      databaseUrl: DATABASE_URL,
      redisUrl: `redis://127.0.0.1:${await freePort()}`,
      keyPrefix: `ops-down-${randomUUID()}`,
      logger: false,
    });
    try {
      const health = await request(down.getHttpServer()).get('/health');
      expect(health.status).toBe(503);
      expect(health.body.error.idempotency).toMatchObject({ status: 'down', store: 'RedisIdempotencyStore' });
    } finally {
      await down.close();
    }
  });
});
