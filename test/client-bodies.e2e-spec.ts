import { afterAll, beforeAll, describe, expect, it } from '@jest/globals';
import {
  Body,
  Controller,
  Get,
  Headers,
  Module,
  Post,
  UploadedFile,
  UseInterceptors,
  type INestApplication,
  type NestInterceptor,
  type Type,
} from '@nestjs/common';
import { NestFactory } from '@nestjs/core';
import { ExpressAdapter, FileInterceptor as ExpressFileInterceptor, type NestExpressApplication } from '@nestjs/platform-express';
import { FastifyAdapter, type NestFastifyApplication } from '@nestjs/platform-fastify';
import { FileInterceptor as FastifyFileInterceptor } from '@nestjs/platform-fastify/multipart';
import { randomUUID } from 'node:crypto';
import { createIdempotentClient, IdempotentRequestError } from '../libs/idempotency-client/src/index.js';
import { IdempotencyModule, NoRepeatSubmit } from '../libs/idempotency/src/index.js';
import { REDIS_URL } from './support/services.js';
import { TcpProxy } from './support/tcp-proxy.js';

type AdapterName = 'express' | 'fastify';

/** Handler runs and GET requests, over all routes. */
const seen = { runs: 0, reads: 0 };

interface UploadedPart {
  originalname: string;
  mimetype: string;
  buffer: Buffer;
}

/** Routes that echo what arrived: a multipart form with a file, a urlencoded form, raw bytes. */
function bodiesController(fileInterceptor: (field: string) => Type<NestInterceptor>): Type<unknown> {
  @Controller()
  class BodiesController {
    @Post('forms')
    @NoRepeatSubmit()
    @UseInterceptors(fileInterceptor('file'))
    form(@Body() fields: Record<string, string> | undefined, @UploadedFile() file: UploadedPart | undefined, @Headers('content-type') type: string) {
      seen.runs++;
      const sent = file && { name: file.originalname, type: file.mimetype, text: file.buffer.toString('utf8') };
      return { run: seen.runs, type: type.split(';')[0], fields: { ...fields }, file: sent ?? null };
    }

    @Post('fields')
    @NoRepeatSubmit()
    fields(@Body() fields: Record<string, string>, @Headers('content-type') type: string) {
      seen.runs++;
      return { run: seen.runs, type, fields: { ...fields } };
    }

    @Post('bytes')
    @NoRepeatSubmit()
    bytes(@Body() body: unknown, @Headers('content-type') type: string) {
      seen.runs++;
      return { run: seen.runs, type, hex: Buffer.isBuffer(body) ? body.toString('hex') : null };
    }

    @Get('reads')
    read() {
      seen.reads++;
      return {};
    }
  }
  return BodiesController;
}

async function createBodiesApp(adapter: AdapterName): Promise<INestApplication> {
  @Module({
    imports: [IdempotencyModule.forRoot({ store: { redis: REDIS_URL }, keyPrefix: `client-bodies-${randomUUID()}` })],
    controllers: [bodiesController(adapter === 'fastify' ? FastifyFileInterceptor : ExpressFileInterceptor)],
  })
  class BodiesModule {}
  const options = { logger: ['error' as const] };
  if (adapter === 'fastify') {
    const app = await NestFactory.create<NestFastifyApplication>(BodiesModule, new FastifyAdapter(), options);
    app.useBodyParser(['application/octet-stream']);
    return app;
  }
  const app = await NestFactory.create<NestExpressApplication>(BodiesModule, new ExpressAdapter(), options);
  app.useBodyParser('raw', { type: 'application/octet-stream' });
  return app;
}

const octets = { headers: { 'content-type': 'application/octet-stream' } };
const form = () => {
  const body = new FormData();
  body.append('orderNo', 'A1');
  body.append('file', new Blob(['hello'], { type: 'text/plain' }), 'a.txt');
  return body;
};

/** What each body must arrive as, on the first attempt and on the retry. */
const BODIES: { what: string; path: string; body: () => unknown; options?: typeof octets; arrives: Record<string, unknown> }[] = [
  {
    what: 'a FormData (fields and a file, multipart)',
    path: '/forms',
    body: form,
    arrives: { type: 'multipart/form-data', fields: { orderNo: 'A1' }, file: { name: 'a.txt', type: 'text/plain', text: 'hello' } },
  },
  {
    what: 'a URLSearchParams (a urlencoded form)',
    path: '/fields',
    body: () => new URLSearchParams({ orderNo: 'A1', note: 'a&b=c' }),
    arrives: { type: 'application/x-www-form-urlencoded;charset=UTF-8', fields: { orderNo: 'A1', note: 'a&b=c' } },
  },
  {
    what: 'a DataView over part of a buffer (its bytes only)',
    path: '/bytes',
    body: () => new DataView(new Uint8Array([9, 0, 255, 1, 9]).buffer, 1, 3),
    options: octets,
    arrives: { hex: '00ff01' },
  },
  { what: 'an Int16Array (its bytes)', path: '/bytes', body: () => new Int16Array([1, -2]), options: octets, arrives: { hex: '0100feff' } },
  {
    what: 'a Blob (its bytes and type)',
    path: '/bytes',
    body: () => new Blob([new Uint8Array([0, 255, 1])], { type: 'application/octet-stream' }),
    arrives: { type: 'application/octet-stream', hex: '00ff01' },
  },
];

/**
 * The client's bodies against a real server on both adapters. A TCP proxy drops the first
 * answer after the server ran the request, so the retry must carry the same payload to get the
 * replay (another payload under the key would be 422).
 */
describe.each<AdapterName>(['express', 'fastify'])('the idempotent client sends what fetch can send, on every attempt (%s)', (adapter) => {
  let app: INestApplication;
  let proxy: TcpProxy;
  let fetchCalls = 0;
  const counting = ((input: string | URL | Request, init?: RequestInit) => {
    fetchCalls++;
    return fetch(input, init);
  }) as typeof fetch;
  const client = () =>
    createIdempotentClient({ baseUrl: `http://127.0.0.1:${proxy.port}`, fetch: counting, backoff: { baseMs: 10, maxMs: 50, jitter: 0 }, timeoutMs: 10_000 });

  beforeAll(async () => {
    app = await createBodiesApp(adapter);
    await app.listen(0, '127.0.0.1');
    proxy = await new TcpProxy({ host: '127.0.0.1', port: Number(new URL(await app.getUrl()).port) }).start();
  });
  afterAll(async () => {
    await proxy?.stop();
    await app?.close();
  });

  it.each(BODIES)('$what: the server gets it, and the retry is replayed the answer', async ({ path, body, options, arrives }) => {
    const runsBefore = seen.runs;
    const droppedBefore = proxy.droppedResponses;
    proxy.dropNextResponse();
    const res = await client().post<Record<string, unknown>>(path, body(), options);

    expect(proxy.droppedResponses).toBe(droppedBefore + 1);
    expect(res).toMatchObject({ status: 201, replayed: true, attempts: 2 });
    expect(res.body).toMatchObject({ run: runsBefore + 1, ...arrives });
    expect(seen.runs).toBe(runsBefore + 1);
  });

  it('refuses a Map before anything is sent (JSON would send {})', async () => {
    const [runsBefore, callsBefore] = [seen.runs, fetchCalls];
    const error = await client()
      .post('/fields', new Map([['orderNo', 'A1']]))
      .catch((e: unknown) => e);
    expect(error).toBeInstanceOf(TypeError);
    expect((error as Error).message).toMatch(/Map/);
    expect([seen.runs, fetchCalls]).toEqual([runsBefore, callsBefore]);
  });

  it('fails a request fetch cannot send (a GET with a body) at once with fetch\'s TypeError, not as four attempts without an answer', async () => {
    const [readsBefore, callsBefore] = [seen.reads, fetchCalls];
    const error = await client()
      .request('GET', '/reads', { a: 1 })
      .catch((e: unknown) => e);
    // fetch's errors come from Node's realm, not the test's: compared by name.
    expect(error).toMatchObject({ name: 'TypeError' });
    expect(error).not.toBeInstanceOf(IdempotentRequestError);
    expect((error as Error).message).toMatch(/GET\/HEAD/);
    expect([seen.reads, fetchCalls - callsBefore]).toEqual([readsBefore, 0]);
    // The same call without a body goes through.
    expect(await client().request('GET', '/reads')).toMatchObject({ status: 200, attempts: 1 });
  });
});
