import { afterAll, beforeAll, describe, expect, it } from '@jest/globals';
import multipart from '@fastify/multipart';
import { Body, Controller, HttpCode, Module, Post, Req, UploadedFile, UseInterceptors, type INestApplication } from '@nestjs/common';
import { NestFactory } from '@nestjs/core';
import { FastifyAdapter, type NestFastifyApplication } from '@nestjs/platform-fastify';
import { FileInterceptor, FileStreamInterceptor } from '@nestjs/platform-fastify/multipart';
import { randomUUID } from 'node:crypto';
import { mkdtempSync, rmSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import request from 'supertest';
import { IdempotencyModule, NoRepeatSubmit } from '../libs/idempotency/src/index.js';
import { REDIS_URL } from './support/services.js';

/**
 * Fastify apps with `@fastify/multipart` as users wire it: Nest 12's upload interceptors
 * (`@nestjs/platform-fastify/multipart`, which register the plugin for the whole app), and the
 * plugin registered by hand with `attachFieldsToBody` (`true` or `'keyValues'`) or read by the
 * handler itself. The plugin puts methods named `file` and `files` on every request.
 */
let runs = 0;

/** Where the disk storage of `/avatars/on-disk` writes. */
const UPLOAD_DIR = mkdtempSync(join(tmpdir(), 'fastify-multipart-'));

interface FilePart {
  type: 'file';
  filename: string;
  toBuffer(): Promise<Buffer>;
}

interface PartsRequest {
  parts(): AsyncIterable<{ type: 'file' | 'field'; fieldname: string; value?: unknown; toBuffer?: () => Promise<Buffer> }>;
}

@Controller()
class UploadsController {
  @Post('orders')
  @NoRepeatSubmit()
  order(@Body() body: unknown) {
    runs++;
    return { run: runs, body };
  }

  /** Nest's Fastify `FileInterceptor`, memory storage: `req.file.buffer`. */
  @Post('avatars')
  @NoRepeatSubmit()
  @UseInterceptors(FileInterceptor('file'))
  avatar(@UploadedFile() file: { buffer: Buffer }, @Body() body: Record<string, string>) {
    runs++;
    return { run: runs, caption: body.caption, bytes: file.buffer.toString('utf8') };
  }

  /** Nest's Fastify `FileInterceptor`, disk storage: `req.file.path`. */
  @Post('avatars/on-disk')
  @NoRepeatSubmit()
  @UseInterceptors(FileInterceptor('file', { dest: UPLOAD_DIR }))
  avatarOnDisk(@UploadedFile() file: { size: number }) {
    runs++;
    return { run: runs, size: file.size };
  }

  /** The file handed to the handler as a stream: the guard cannot see its bytes first. */
  @Post('avatars/streamed')
  @NoRepeatSubmit()
  @UseInterceptors(FileStreamInterceptor('file'))
  avatarStreamed() {
    runs++;
    return { run: runs };
  }

  /** `@fastify/multipart` with `attachFieldsToBody: true`: every field a part, files buffered. */
  @Post('documents')
  @NoRepeatSubmit()
  async document(@Body() body: { title: { value: string }; doc: FilePart }) {
    runs++;
    return { run: runs, title: body.title.value, name: body.doc.filename, bytes: (await body.doc.toBuffer()).toString('utf8') };
  }

  /** `@fastify/multipart` with `attachFieldsToBody: 'keyValues'`: fields as strings, files as Buffers. */
  @Post('documents/values')
  @NoRepeatSubmit()
  documentValues(@Body() body: { title: string; doc: Buffer }) {
    runs++;
    return { run: runs, title: body.title, bytes: body.doc.toString('utf8') };
  }

  /** Any form (`attachFieldsToBody`): the names of what came. */
  @Post('forms')
  @NoRepeatSubmit()
  form(@Body() body: Record<string, unknown> | undefined) {
    runs++;
    return { run: runs, names: Object.keys(body ?? {}).sort() };
  }

  /** A handler that reads the parts itself, after the guard. */
  @Post('parts')
  @HttpCode(200)
  @NoRepeatSubmit()
  async parts(@Req() req: PartsRequest) {
    let files = 0;
    for await (const part of req.parts()) if (part.type === 'file') files += (await part.toBuffer!()).length > 0 ? 1 : 0;
    runs++;
    return { run: runs, files };
  }
}

type Wiring = 'interceptors' | 'attach' | 'keyValues';

interface CopiedRequest {
  headers: Record<string, string | undefined>;
  body?: Record<string, unknown>;
}

async function start(wiring: Wiring): Promise<INestApplication> {
  @Module({
    imports: [IdempotencyModule.forRoot({ store: { redis: REDIS_URL }, keyPrefix: `fastify-multipart-${randomUUID().slice(0, 8)}` })],
    controllers: [UploadsController],
  })
  class AppModule {}
  const app = await NestFactory.create<NestFastifyApplication>(AppModule, new FastifyAdapter(), { logger: ['error'] });
  if (wiring === 'attach') {
    await app.register(multipart, { attachFieldsToBody: true });
    // With `x-copy-body`, a hook replaces the body with a copy (fields as values, file parts kept), as apps do.
    const fastify = app.getHttpAdapter().getInstance() as { addHook(name: 'preValidation', hook: (req: CopiedRequest) => Promise<void>): void };
    fastify.addHook('preValidation', async (req) => {
      if (!req.headers['x-copy-body'] || !req.body) return;
      const parts = Object.entries(req.body as Record<string, { type: string; value?: unknown }>);
      req.body = Object.fromEntries(parts.map(([name, part]) => [name, part.type === 'field' ? part.value : part]));
    });
  }
  if (wiring === 'keyValues') await app.register(multipart, { attachFieldsToBody: 'keyValues' });
  await app.listen(0, '127.0.0.1');
  return app;
}

/** A multipart POST under `key`: a `caption`/`title` field and a file. */
function upload(app: INestApplication, path: string, key: string, content: string, field = 'file', text = 'me') {
  return request(app.getHttpServer())
    .post(path)
    .set('idempotency-key', key)
    .field(field === 'file' ? 'caption' : 'title', text)
    .attach(field, Buffer.from(content), { filename: 'a.txt', contentType: 'text/plain' });
}

afterAll(() => rmSync(UPLOAD_DIR, { recursive: true, force: true }));

describe("Fastify with Nest's upload interceptors (@nestjs/platform-fastify/multipart)", () => {
  let app: INestApplication;
  beforeAll(async () => {
    app = await start('interceptors');
  });
  afterAll(async () => app?.close());

  it('a guarded JSON route of the app is guarded, not refused 400 because the plugin put methods named file and files on the request', async () => {
    const key = randomUUID();
    const post = () => request(app.getHttpServer()).post('/orders').set('idempotency-key', key).send({ sku: 'a' });
    const first = await post();
    // Before the fix: 400 IDEMPOTENCY_PAYLOAD_UNSUPPORTED ("the bytes of an uploaded file are not available") on every guarded route.
    expect({ status: first.status, code: first.body.code }).toEqual({ status: 201, code: undefined });
    const again = await post();
    expect([again.status, again.headers['idempotent-replayed'], again.body]).toEqual([201, 'true', first.body]);
    const other = await request(app.getHttpServer()).post('/orders').set('idempotency-key', key).send({ sku: 'b' });
    expect(other.status).toBe(422);
  });

  it('an upload in memory: the same file is replayed, another file under the same key is 422', async () => {
    const key = randomUUID();
    const first = await upload(app, '/avatars', key, 'FIRST FILE');
    expect([first.status, first.body.bytes]).toEqual([201, 'FIRST FILE']);
    const again = await upload(app, '/avatars', key, 'FIRST FILE');
    expect([again.status, again.headers['idempotent-replayed'], again.body]).toEqual([201, 'true', first.body]);
    const other = await upload(app, '/avatars', key, 'A COMPLETELY DIFFERENT FILE');
    expect([other.status, other.body.code]).toEqual([422, 'IDEMPOTENCY_KEY_REUSED']);
  });

  it('text fields whose bracket names nest into an object shaped like a part are text: another value under the same key is 422', async () => {
    const key = randomUUID();
    const post = (fields: [string, string][]) => {
      const req = request(app.getHttpServer()).post('/avatars').set('idempotency-key', key);
      for (const [name, value] of fields) req.field(name, value);
      return req.attach('file', Buffer.from('F'), { filename: 'a.txt', contentType: 'text/plain' });
    };
    expect((await post([['q[type]', 'field'], ['q[fieldname]', 'email'], ['q[value]', 'v'], ['caption', 'c']])).status).toBe(201);
    // Before the fix (c05116d): 201 replayed, the nested object taken for a field part whose value is 'v'.
    const other = await post([['q', 'v'], ['caption', 'c']]);
    expect([other.status, other.body.code]).toEqual([422, 'IDEMPOTENCY_KEY_REUSED']);
  });

  it('an upload on disk: counted by its bytes on disk (another file of the same size under the same key is 422)', async () => {
    const key = randomUUID();
    expect((await upload(app, '/avatars/on-disk', key, 'AAAA')).status).toBe(201);
    expect((await upload(app, '/avatars/on-disk', key, 'AAAA')).headers['idempotent-replayed']).toBe('true');
    expect((await upload(app, '/avatars/on-disk', key, 'BBBB')).status).toBe(422);
  });

  it('a file handed to the handler as a stream is refused 400 before the handler, never guarded without its bytes', async () => {
    const before = runs;
    const answer = await upload(app, '/avatars/streamed', randomUUID(), 'STREAMED');
    expect([answer.status, answer.body.code]).toEqual([400, 'IDEMPOTENCY_PAYLOAD_UNSUPPORTED']);
    expect(answer.body.message).toContain('stream');
    expect(runs).toBe(before);
  });

  it('a handler that reads the parts itself is refused 400 with what to use instead, never guarded without its files', async () => {
    const before = runs;
    const answer = await upload(app, '/parts', randomUUID(), 'PARTS');
    expect([answer.status, answer.body.code]).toEqual([400, 'IDEMPOTENCY_PAYLOAD_UNSUPPORTED']);
    // Before the fix: advice to register a raw body parser for multipart/form-data, which would take the parts from the handler.
    expect(answer.body.message).toContain('FileInterceptor');
    expect(answer.body.message).not.toContain('useBodyParser');
    expect(runs).toBe(before);
  });
});

describe('Fastify with @fastify/multipart, attachFieldsToBody: true', () => {
  let app: INestApplication;
  beforeAll(async () => {
    app = await start('attach');
  });
  afterAll(async () => app?.close());

  it('the same upload is replayed; another file, or another field, under the same key is 422', async () => {
    const key = randomUUID();
    const first = await upload(app, '/documents', key, 'FIRST FILE', 'doc');
    // Before the fix: 400 IDEMPOTENCY_PAYLOAD_UNSUPPORTED.
    expect([first.status, first.body]).toEqual([201, { run: runs, title: 'me', name: 'a.txt', bytes: 'FIRST FILE' }]);
    const again = await upload(app, '/documents', key, 'FIRST FILE', 'doc');
    expect([again.status, again.headers['idempotent-replayed'], again.body]).toEqual([201, 'true', first.body]);
    expect((await upload(app, '/documents', key, 'OTHER FILE', 'doc')).status).toBe(422);
    expect((await upload(app, '/documents', key, 'FIRST FILE', 'doc', 'you')).status).toBe(422);
  });

  it('a body a hook copied (its parts still refer to the body the plugin made): the same upload is replayed, another file is 422', async () => {
    const key = randomUUID();
    const post = (content: string) =>
      request(app.getHttpServer())
        .post('/forms')
        .set('idempotency-key', key)
        .set('x-copy-body', '1')
        .field('note', 'n')
        .attach('doc', Buffer.from(content), { filename: 'a.txt', contentType: 'text/plain' });
    const first = await post('FIRST FILE');
    // Before the fix (4e7127a): 400, "it nests deeper than 1000 levels" (the part, not taken for one, hashed with its back-reference).
    expect([first.status, first.body.names]).toEqual([201, ['doc', 'note']]);
    const again = await post('FIRST FILE');
    expect([again.status, again.headers['idempotent-replayed'], again.body]).toEqual([201, 'true', first.body]);
    expect((await post('OTHER FILE')).status).toBe(422);
  });

  it('files in two fields sent in the other order are the same upload (replayed); an empty form is guarded, not refused', async () => {
    const key = randomUUID();
    const post = (order: string[]) => {
      const req = request(app.getHttpServer()).post('/forms').set('idempotency-key', key);
      for (const name of order) req.attach(name, Buffer.from(`bytes of ${name}`), { filename: `${name}.txt`, contentType: 'text/plain' });
      return req;
    };
    const first = await post(['a', 'b']);
    expect([first.status, first.body.names]).toEqual([201, ['a', 'b']]);
    const swapped = await post(['b', 'a']);
    expect([swapped.status, swapped.headers['idempotent-replayed'], swapped.body]).toEqual([201, 'true', first.body]);

    const empty = () => request(app.getHttpServer()).post('/forms').set('idempotency-key', randomUUID()).type('multipart/form-data; boundary=x').send('--x--\r\n');
    const answer = await empty();
    // Before the fix: 400, "no body parser read its multipart/form-data body", advising attachFieldsToBody (on already).
    expect([answer.status, answer.body.names]).toEqual([201, []]);
  });

  it('a guarded JSON route of the same app is guarded as before', async () => {
    const key = randomUUID();
    const post = (sku: string) => request(app.getHttpServer()).post('/orders').set('idempotency-key', key).send({ sku });
    expect((await post('a')).status).toBe(201);
    expect((await post('a')).headers['idempotent-replayed']).toBe('true');
    expect((await post('b')).status).toBe(422);
  });
});

describe("Fastify with @fastify/multipart, attachFieldsToBody: 'keyValues'", () => {
  let app: INestApplication;
  beforeAll(async () => {
    app = await start('keyValues');
  });
  afterAll(async () => app?.close());

  it('the same upload is replayed; another file under the same key is 422', async () => {
    const key = randomUUID();
    const first = await upload(app, '/documents/values', key, 'FIRST FILE', 'doc');
    // Before the fix: 400 IDEMPOTENCY_PAYLOAD_UNSUPPORTED.
    expect([first.status, first.body.bytes]).toEqual([201, 'FIRST FILE']);
    const again = await upload(app, '/documents/values', key, 'FIRST FILE', 'doc');
    expect([again.status, again.headers['idempotent-replayed'], again.body]).toEqual([201, 'true', first.body]);
    expect((await upload(app, '/documents/values', key, 'OTHER FILE', 'doc')).status).toBe(422);
  });
});
