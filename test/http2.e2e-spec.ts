// Fastify over HTTP/2 (h2c): a storm on one session runs the handler once and replays it, and a
// key header sent on two lines is refused 400 as on HTTP/1.1. Node's HTTP/2 compatibility request
// has no `headersDistinct`, and the two lines joined (`a, b`) were taken for one key (201; an
// adversarial helper).
import { afterAll, beforeAll, describe, expect, it } from '@jest/globals';
import { Controller, Module, Post, type INestApplication } from '@nestjs/common';
import { NestFactory } from '@nestjs/core';
import { FastifyAdapter } from '@nestjs/platform-fastify';
import { randomUUID } from 'node:crypto';
import { connect, type ClientHttp2Session, type OutgoingHttpHeaders } from 'node:http2';
import { IdempotencyModule, NoRepeatSubmit } from '../libs/idempotency/src/index.js';
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

@Module({
  imports: [IdempotencyModule.forRoot({ store: { redis: REDIS_URL }, keyPrefix: `h2${randomUUID().slice(0, 8)}` })],
  controllers: [OrdersController],
})
class Http2Module {}

interface H2Answer {
  status: number;
  replayed: boolean;
  body: string;
}

function post(session: ClientHttp2Session, headers: OutgoingHttpHeaders): Promise<H2Answer> {
  return new Promise((resolve, reject) => {
    const stream = session.request({ ':method': 'POST', ':path': '/orders', 'content-type': 'application/json', ...headers });
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
