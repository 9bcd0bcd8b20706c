import { afterAll, afterEach, beforeAll, describe, expect, it, jest } from '@jest/globals';
import { Logger, type INestApplication } from '@nestjs/common';
import { Redis } from 'ioredis';
import { randomUUID } from 'node:crypto';
import { createServer, type Server, type Socket } from 'node:net';
import request from 'supertest';
import { IdempotencyCounters } from '../libs/idempotency/src/index.js';
import { createGuardTestApp, Probe, type AdapterName } from './support/guard-test.app.js';
import { until } from './support/http.js';
import { freePort, startRedisServer, type RedisServer } from './support/redis-server.js';
import { REDIS_URL } from './support/services.js';
import { TcpProxy } from './support/tcp-proxy.js';

/**
 * The client the module creates bounds every command by 1 s; an answer must come well within
 * this, and a slow Redis (the proxy) takes 20 s, so that an unbounded wait cannot pass for a
 * bounded one on a loaded CI machine (a helper that froze the process for 0-2.5 s at a time saw
 * 3.5-5.5 s answers against the 3 s this was, with a 5 s delay).
 */
const BOUND_MS = 8000;
const SLOW_REDIS_MS = 20_000;

async function timed<T>(work: PromiseLike<T>): Promise<[T, number]> {
  const started = Date.now();
  const result = await work;
  return [result, Date.now() - started];
}

/** With the store unreachable: a fail-open route runs (201), a fail-closed one answers 503, both within the bound. */
async function expectOutagePolicy(app: INestApplication, key = randomUUID()): Promise<void> {
  const [open, openMs] = await timed(request(app.getHttpServer()).post('/payments').set('Idempotency-Key', randomUUID()).send({}));
  expect(open.status).toBe(201);
  expect(openMs).toBeLessThan(BOUND_MS);
  const [closed, closedMs] = await timed(request(app.getHttpServer()).post('/closed').set('Idempotency-Key', key));
  expect(closed.status).toBe(503);
  expect(closed.body).toMatchObject({ statusCode: 503, code: 'IDEMPOTENCY_STORE_UNAVAILABLE' });
  expect(Number(closed.headers['retry-after'])).toBeGreaterThanOrEqual(1);
  expect(closedMs).toBeLessThan(BOUND_MS);
}

describe.each<AdapterName>(['express', 'fastify'])('the entry guard when Redis is unavailable (%s)', (adapter) => {
  let app: INestApplication | undefined;
  afterEach(async () => {
    await app?.close();
    app = undefined;
  });

  it('fails open by default and fails closed with 503 + Retry-After where asked, with nothing listening', async () => {
    const port = await freePort();
    app = await createGuardTestApp(adapter, { store: { redis: `redis://127.0.0.1:${port}` }, keyPrefix: 'outage' });
    const probe = app.get(Probe);
    const key = randomUUID();

    const [open, openMs] = await timed(request(app.getHttpServer()).post('/payments').set('Idempotency-Key', key).send({}));
    expect(open.status).toBe(201);
    expect(openMs).toBeLessThan(BOUND_MS);
    const [again] = await timed(request(app.getHttpServer()).post('/payments').set('Idempotency-Key', key).send({}));
    expect(again.status).toBe(201);
    expect(probe.runs).toBe(2); // unguarded while the store is down: the database layer is the backstop

    const [closed, closedMs] = await timed(request(app.getHttpServer()).post('/closed').set('Idempotency-Key', key));
    expect(closed.status).toBe(503);
    expect(closed.body).toMatchObject({ statusCode: 503, code: 'IDEMPOTENCY_STORE_UNAVAILABLE' });
    expect(Number(closed.headers['retry-after'])).toBeGreaterThanOrEqual(1);
    expect(closedMs).toBeLessThan(BOUND_MS);
    expect(probe.runs).toBe(2);
    const counters = app.get(IdempotencyCounters);
    expect(counters.failOpen).toBeGreaterThanOrEqual(2);
  });

  // A line (and more at debug level) per request flooded the log at the rate of the traffic for
  // as long as the outage lasted (an adversarial helper: 2,010 lines for 500 requests).
  it('logs a burst of requests during an outage in one line per route and policy, not one per request', async () => {
    const port = await freePort();
    app = await createGuardTestApp(adapter, { store: { redis: `redis://127.0.0.1:${port}` }, keyPrefix: 'outage' });
    const lines: string[] = [];
    const spies = (['warn', 'error', 'log', 'debug', 'verbose'] as const).map((level) =>
      jest.spyOn(Logger.prototype, level).mockImplementation(function (this: Logger, message: unknown) {
        if ((this as unknown as { context?: string }).context !== 'NestApplication') lines.push(`${level}: ${String(message)}`);
      }),
    );
    try {
      const server = app.getHttpServer();
      const answers = await Promise.all([
        ...Array.from({ length: 50 }, () => request(server).post('/payments').set('Idempotency-Key', randomUUID()).send({})),
        ...Array.from({ length: 50 }, () => request(server).post('/closed').set('Idempotency-Key', randomUUID())),
      ]);
      expect(answers.map((answer) => answer.status).sort()).toEqual([...Array(50).fill(201), ...Array(50).fill(503)]);
      await new Promise((resolve) => setTimeout(resolve, 500)); // the saves' tries after the answers
      const outage = lines.filter((line) => /unguarded|refusing|save|claim/.test(line));
      // Observed before: 150 lines (a warning per request, a debug line per fail-open save).
      expect({ lines: outage.length, kinds: outage }).toEqual({
        lines: 2,
        kinds: expect.arrayContaining([expect.stringMatching(/^warn: .*running unguarded$/), expect.stringMatching(/^warn: .*refusing$/)]),
      });
    } finally {
      for (const spy of spies) spy.mockRestore();
    }
  });

  describe('with a redis-server that is killed', () => {
    let server: RedisServer;
    beforeAll(async () => {
      server = await startRedisServer();
    });
    afterAll(async () => server.kill());

    it('guards while it runs, answers within the bound once it is killed, and guards again once it is back', async () => {
      app = await createGuardTestApp(adapter, { store: { redis: server.url }, keyPrefix: 'killed' });
      const key = randomUUID();
      await request(app.getHttpServer()).post('/payments').set('Idempotency-Key', key).send({});
      const replay = await request(app.getHttpServer()).post('/payments').set('Idempotency-Key', key).send({});
      expect(replay.headers['idempotent-replayed']).toBe('true');

      await server.kill();
      await expectOutagePolicy(app, key);

      // Started again on the same port: the client reconnects and the guard resumes.
      server = await startRedisServer(server.port);
      const fresh = randomUUID();
      await until(async () => {
        const res = await request(app!.getHttpServer()).post('/closed').set('Idempotency-Key', fresh);
        return res.status === 201;
      }, 10_000);
      const again = await request(app.getHttpServer()).post('/closed').set('Idempotency-Key', fresh);
      expect(again.headers['idempotent-replayed']).toBe('true');
    });
  });

  // Every run that failed in an outage logged "Could not release an idempotency key" for itself:
  // a line per request, at the rate of the traffic (an adversarial helper).
  describe('with a redis-server killed while handlers run', () => {
    let server: RedisServer;
    beforeAll(async () => {
      server = await startRedisServer();
    });
    afterAll(async () => server.kill());

    it('logs the releases that fail in one line per route, not one per request', async () => {
      app = await createGuardTestApp(adapter, { store: { redis: server.url }, keyPrefix: 'killed-release' });
      const probe = app.get(Probe);
      const lines: string[] = [];
      const spies = (['warn', 'error'] as const).map((level) =>
        jest.spyOn(Logger.prototype, level).mockImplementation((message: unknown) => void lines.push(`${level}: ${String(message)}`)),
      );
      try {
        probe.hold();
        probe.failuresLeft = 20;
        const http = app.getHttpServer();
        const answers = Promise.all(Array.from({ length: 20 }, () => request(http).post('/closed').set('Idempotency-Key', randomUUID())));
        await until(() => probe.runs === 20, 10_000);
        await server.kill();
        probe.release();
        expect((await answers).map((answer) => answer.status)).toEqual(Array(20).fill(400));
        await new Promise((resolve) => setTimeout(resolve, 500));
        // Observed before: 20 lines, one per request.
        expect(lines.filter((line) => /release/i.test(line))).toEqual([expect.stringMatching(/^warn: .*could not release an idempotency key/)]);
      } finally {
        for (const spy of spies) spy.mockRestore();
      }
    });
  });

  describe('with a Redis that turns slow after the app connected (a delaying proxy)', () => {
    let proxy: TcpProxy;
    beforeAll(async () => {
      const [host, port] = REDIS_URL.replace('redis://', '').split(':');
      proxy = await new TcpProxy({ host, port: Number(port) }).start();
    });
    afterAll(async () => proxy.stop());

    it('bounds each request by the command timeout, and guards again once Redis is fast', async () => {
      proxy.delayMs = 0;
      app = await createGuardTestApp(adapter, { store: { redis: proxy.url }, keyPrefix: `slow-${randomUUID()}` });
      const key = randomUUID();
      const first = await request(app.getHttpServer()).post('/payments').set('Idempotency-Key', key).send({});
      expect(first.status).toBe(201);

      proxy.delayMs = SLOW_REDIS_MS;
      await expectOutagePolicy(app);

      proxy.delayMs = 0;
      proxy.cut(); // drop the connection whose replies are still queued; ioredis reconnects
      await until(async () => {
        const res = await request(app!.getHttpServer()).post('/payments').set('Idempotency-Key', key).send({});
        return res.headers['idempotent-replayed'] === 'true';
      }, 10_000);
    });
  });

  // A client the app hands in, made with ioredis's defaults (an offline queue, 20 retries per
  // command, no command timeout), as most apps make theirs: the guard bounds its own commands.
  describe('with a client of ioredis defaults that the app hands in', () => {
    let client: Redis | undefined;
    let proxy: TcpProxy | undefined;
    afterEach(async () => {
      client?.disconnect();
      client = undefined;
      await proxy?.stop();
      proxy = undefined;
    });

    /** The app on a client made as `new Redis(url)`, whose Redis is behind a proxy the test slows. */
    const appBehindProxy = async () => {
      const [host, port] = REDIS_URL.replace('redis://', '').split(':');
      proxy = await new TcpProxy({ host, port: Number(port) }).start();
      client = new Redis(proxy.url);
      client.on('error', () => undefined);
      app = await createGuardTestApp(adapter, { store: { redis: client }, keyPrefix: `user-client-${randomUUID()}` });
      return { app, proxy };
    };

    it('answers within the bound when Redis turns slow', async () => {
      const { app, proxy } = await appBehindProxy();
      proxy.delayMs = SLOW_REDIS_MS;
      await expectOutagePolicy(app);
    });

    it('frees a key whose claim lands after its 503 (fail-closed): a retry once Redis is fast runs the handler', async () => {
      const { app, proxy } = await appBehindProxy();
      const key = randomUUID();
      proxy.delayMs = 2000;
      const refused = await request(app.getHttpServer()).post('/closed').set('Idempotency-Key', key);
      expect(refused.status).toBe(503);
      proxy.delayMs = 0;
      // The claim sent before the 503 lands about 2 s after it was sent; then the key must be free
      // (were it held, it would be for the 10 s lease).
      await new Promise((resolve) => setTimeout(resolve, 5000));
      const retry = await request(app.getHttpServer()).post('/closed').set('Idempotency-Key', key);
      expect({ status: retry.status, code: retry.body?.code }).toEqual({ status: 201, code: undefined });
    });

    it('answers within the bound when its redis-server is killed', async () => {
      const server = await startRedisServer();
      try {
        client = new Redis(server.url);
        client.on('error', () => undefined);
        app = await createGuardTestApp(adapter, { store: { redis: client }, keyPrefix: 'user-client-killed' });
        await server.kill();
        await expectOutagePolicy(app);
      } finally {
        await server.kill();
      }
    });
  });

  describe('with a Redis that accepts connections and never answers', () => {
    let blackHole: Server;
    const sockets: Socket[] = [];
    beforeAll(async () => {
      blackHole = createServer((socket) => sockets.push(socket));
      await new Promise<void>((resolve) => blackHole.listen(0, '127.0.0.1', resolve));
    });
    afterAll(async () => {
      sockets.forEach((socket) => socket.destroy());
      await new Promise((resolve) => blackHole.close(resolve));
    });

    it('does not hang a request', async () => {
      const { port } = blackHole.address() as { port: number };
      app = await createGuardTestApp(adapter, { store: { redis: `redis://127.0.0.1:${port}` }, keyPrefix: 'slow' });
      await expectOutagePolicy(app);
    });
  });
});
