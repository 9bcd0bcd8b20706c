// Fastify over HTTP/2 (h2c): a storm on one session runs the handler once and replays it, and a
// key header sent on two lines is refused 400 as on HTTP/1.1. Node's HTTP/2 compatibility request
// has no `headersDistinct`, and the two lines joined (`a, b`) were taken for one key (201; an
// adversarial helper).
import { afterAll, beforeAll, describe, expect, it } from '@jest/globals';
import { Controller, HttpCode, Module, Post, type INestApplication } from '@nestjs/common';
import { NestFactory } from '@nestjs/core';
import { FastifyAdapter } from '@nestjs/platform-fastify';
import { execFile } from 'node:child_process';
import { randomUUID } from 'node:crypto';
import { connect, type ClientHttp2Session, type OutgoingHttpHeaders } from 'node:http2';
import { promisify } from 'node:util';
import { IdempotencyModule, MemoryIdempotencyStore, NoRepeatSubmit, type SavedResponse } from '../libs/idempotency/src/index.js';
import { REDIS_URL } from './support/services.js';

let runs = 0;

@Controller('orders')
class OrdersController {
  @Post()
  @NoRepeatSubmit()
  async create() {
    runs++;
    await new Promise((resolve) => setTimeout(resolve, 30));
    return { order: runs };
  }
}

let bodiless = 0;

@Controller('marks')
class MarksController {
  @Post('seen')
  @HttpCode(204)
  @NoRepeatSubmit()
  seen() {
    bodiless++;
  }

  @Post('reset')
  @HttpCode(205)
  @NoRepeatSubmit()
  reset() {
    bodiless++;
    return '';
  }
}

@Module({
  imports: [IdempotencyModule.forRoot({ store: { redis: REDIS_URL }, keyPrefix: `h2${randomUUID().slice(0, 8)}` })],
  controllers: [OrdersController, MarksController],
})
class Http2Module {}

interface H2Answer {
  status: number;
  replayed: boolean;
  body: string;
}

function post(session: ClientHttp2Session, headers: OutgoingHttpHeaders, path = '/orders'): Promise<H2Answer> {
  return new Promise((resolve, reject) => {
    const stream = session.request({ ':method': 'POST', ':path': path, 'content-type': 'application/json', ...headers });
    let status = 0;
    let replayed = false;
    const chunks: Buffer[] = [];
    stream.on('response', (h) => {
      status = Number(h[':status']);
      replayed = h['idempotent-replayed'] === 'true';
    });
    stream.on('data', (chunk: Buffer) => chunks.push(chunk));
    stream.on('end', () => resolve({ status, replayed, body: Buffer.concat(chunks).toString() }));
    stream.on('error', reject);
    stream.end('{"item":"book"}');
  });
}

describe('Fastify over HTTP/2', () => {
  let app: INestApplication;
  let session: ClientHttp2Session;
  beforeAll(async () => {
    app = await NestFactory.create(Http2Module, new FastifyAdapter({ http2: true }) as never, { logger: false });
    await app.listen(0, '127.0.0.1');
    session = connect(`http://127.0.0.1:${(app.getHttpServer().address() as { port: number }).port}`);
  });
  afterAll(async () => {
    session?.close();
    await app?.close();
  });

  it('runs 50 streams of one key on one session once, and replays the first answer', async () => {
    runs = 0;
    const key = randomUUID();
    const storm = await Promise.all(Array.from({ length: 50 }, () => post(session, { 'idempotency-key': key })));
    const again = await post(session, { 'idempotency-key': key });
    const firsts = storm.filter((a) => a.status === 201 && !a.replayed);
    expect({ runs, firsts: firsts.length, others: [...new Set(storm.filter((a) => a !== firsts[0]).map((a) => a.status))].sort() }).toEqual({
      runs: 1,
      firsts: 1,
      others: expect.arrayContaining([409]),
    });
    expect({ status: again.status, replayed: again.replayed, body: again.body }).toEqual({ status: 201, replayed: true, body: firsts[0]!.body });
  });

  it('refuses a key header sent on two lines 400 IDEMPOTENCY_KEY_INVALID', async () => {
    runs = 0;
    const answers = await Promise.all([
      post(session, { 'idempotency-key': [`a-${randomUUID()}`, `b-${randomUUID()}`] }),
      post(session, { 'idempotency-key': ['same', 'same'].map((k) => `${k}-${runs}`) }),
    ]);
    // Observed before: 201 and 201 (the key "a, b").
    expect({ statuses: answers.map((a) => a.status), codes: answers.map((a) => JSON.parse(a.body).code), runs }).toEqual({
      statuses: [400, 400],
      codes: ['IDEMPOTENCY_KEY_INVALID', 'IDEMPOTENCY_KEY_INVALID'],
      runs: 0,
    });
  });
});

/**
 * The memory store, its saves 50 ms late (a store across a network): the time between a head
 * going out and its answer being saved, which a duplicate must not fall into.
 */
class SlowSaveStore extends MemoryIdempotencyStore {
  override async complete(key: string, token: string, response: SavedResponse, retentionMs: number): Promise<boolean> {
    await new Promise((resolve) => setTimeout(resolve, 50));
    return super.complete(key, token, response, retentionMs);
  }
}

// An adversarial helper: on HTTP/2 a head with a status that has no body (204, 205) ends the
// stream when it is written, and the capture passed it through at once: the first client had
// its whole answer before the answer was saved, and a duplicate sent right then got 409 (6 to
// 18 of 60 keys). The head now waits for the save, as the answer's bytes do.
describe('Fastify over HTTP/2, answers without a body', () => {
  let app: INestApplication;
  let session: ClientHttp2Session;
  beforeAll(async () => {
    @Module({ imports: [IdempotencyModule.forRoot({ store: new SlowSaveStore() })], controllers: [MarksController] })
    class MarksModule {}
    app = await NestFactory.create(MarksModule, new FastifyAdapter({ http2: true }) as never, { logger: false });
    await app.listen(0, '127.0.0.1');
    session = connect(`http://127.0.0.1:${(app.getHttpServer().address() as { port: number }).port}`);
  });
  afterAll(async () => {
    session?.close();
    await app?.close();
  });

  it.each([
    ['204', '/marks/seen'],
    ['205', '/marks/reset'],
  ])('saves a %s before the client has it: a duplicate sent at once is replayed', async (status, path) => {
    bodiless = 0;
    const refused: number[] = [];
    for (let i = 0; i < 10; i++) {
      const key = randomUUID();
      const first = await post(session, { 'idempotency-key': key }, path);
      const again = await post(session, { 'idempotency-key': key }, path);
      expect([first.status, first.replayed]).toEqual([Number(status), false]);
      if (again.status !== Number(status) || !again.replayed) refused.push(again.status);
    }
    expect({ refused, runs: bodiless }).toEqual({ refused: [], runs: 10 });
  });
});

@Controller('work')
class WorkController {
  @Post('slow')
  @NoRepeatSubmit()
  async slow() {
    await new Promise((resolve) => setTimeout(resolve, 800));
    return { done: true };
  }
}

// An instance shutting down refuses new calls 503 and, on HTTP/1.1, closes the connection after
// it (`Connection: close`); HTTP/2 has no such header (Node's HTTP/2 response throws on one).
describe('Fastify over HTTP/2, shutting down', () => {
  it('refuses a call while it drains, 503 without a Connection header', async () => {
    @Module({ imports: [IdempotencyModule.forRoot({ store: new MemoryIdempotencyStore() })], controllers: [WorkController] })
    class WorkModule {}
    const app = await NestFactory.create(WorkModule, new FastifyAdapter({ http2: true }) as never, { logger: false });
    await app.listen(0, '127.0.0.1');
    const session = connect(`http://127.0.0.1:${(app.getHttpServer().address() as { port: number }).port}`);
    try {
      const running = post(session, { 'idempotency-key': randomUUID() }, '/work/slow');
      await new Promise((resolve) => setTimeout(resolve, 100));
      const closed = app.close();
      await new Promise((resolve) => setTimeout(resolve, 100));
      const during = await new Promise<{ status: number; connection: unknown; code: string }>((resolve, reject) => {
        const stream = session.request({ ':method': 'POST', ':path': '/work/slow', 'content-type': 'application/json', 'idempotency-key': randomUUID() });
        let head: Record<string, unknown> = {};
        const chunks: Buffer[] = [];
        stream.on('response', (h) => (head = h));
        stream.on('data', (chunk: Buffer) => chunks.push(chunk));
        stream.on('end', () => resolve({ status: Number(head[':status']), connection: head.connection, code: JSON.parse(Buffer.concat(chunks).toString()).code }));
        stream.on('error', reject);
        stream.end('{}');
      });
      expect(during).toEqual({ status: 503, connection: undefined, code: 'IDEMPOTENCY_STORE_UNAVAILABLE' });
      expect((await running).status).toBe(201);
      // The server closes once its sessions have.
      session.close();
      await closed;
    } finally {
      session.close();
    }
  });
});

// An adversarial helper: every HTTP/2 app under the guard printed `UnsupportedWarning: Status
// message is not supported by HTTP/2`, the capture reading the response's status message. Node
// prints it once a process: a process of its own.
describe('Fastify over HTTP/2, warnings', () => {
  it('answers and replays without a warning', async () => {
    const { stdout } = await promisify(execFile)(process.execPath, ['--import', './test/support/ts-register.mjs', 'test/support/http2-warning-child.ts'], {
      timeout: 60_000,
    });
    expect(JSON.parse(stdout.trim().split('\n').pop()!)).toEqual({ statuses: [201, 201], warnings: [] });
  });
});
