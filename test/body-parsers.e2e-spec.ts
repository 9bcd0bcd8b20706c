import { afterAll, beforeAll, describe, expect, it } from '@jest/globals';
import {
  Body,
  Controller,
  Delete,
  Get,
  HttpCode,
  Module,
  Param,
  Post,
  Req,
  UploadedFile,
  UploadedFiles,
  UseInterceptors,
  type INestApplication,
} from '@nestjs/common';
import { NestFactory } from '@nestjs/core';
import { AnyFilesInterceptor, ExpressAdapter, FileInterceptor, type NestExpressApplication } from '@nestjs/platform-express';
import { FastifyAdapter, type NestFastifyApplication } from '@nestjs/platform-fastify';
import { randomUUID } from 'node:crypto';
import { mkdtempSync, rmSync } from 'node:fs';
import { request as httpRequest } from 'node:http';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import request from 'supertest';
import { IdempotencyModule, NoRepeatSubmit } from '../libs/idempotency/src/index.js';
import { REDIS_URL } from './support/services.js';

/**
 * Body parsers as users configure them, without `rawBody`: multer uploads, parsers for other
 * types, bodies a parser never read (a GET on Fastify, an empty chunked body), text that is not
 * UTF-8. Each test failed on the guard before its fix.
 */
let runs = 0;

/** Where multer's disk storage writes the uploads of `/avatars/on-disk`. */
const UPLOAD_DIR = mkdtempSync(join(tmpdir(), 'body-parsers-'));

/** A multer storage engine that keeps neither a buffer nor a path (as one that streams to a bucket). */
const elsewhere = {
  _handleFile(_req: unknown, file: { stream: NodeJS.ReadableStream }, done: (error: null, info: { size: number }) => void) {
    let size = 0;
    file.stream.on('data', (chunk: Buffer) => (size += chunk.length));
    file.stream.on('end', () => done(null, { size }));
  },
  _removeFile(_req: unknown, _file: unknown, done: (error: null) => void) {
    done(null);
  },
};

@Controller()
class UploadsController {
  /** Multer's FileInterceptor reads the multipart body before the guard (the guard is innermost). */
  @Post('avatars')
  @NoRepeatSubmit()
  @UseInterceptors(FileInterceptor('file'))
  avatar(@UploadedFile() file: { buffer: Buffer; originalname: string }, @Body() body: Record<string, string>) {
    runs++;
    return { run: runs, caption: body.caption, bytes: file?.buffer.toString('utf8') };
  }

  /** Multer's disk storage: the file is on disk (`path`), not in memory. */
  @Post('avatars/on-disk')
  @NoRepeatSubmit()
  @UseInterceptors(FileInterceptor('file', { dest: UPLOAD_DIR }))
  avatarOnDisk(@UploadedFile() file: { originalname: string; size: number }) {
    runs++;
    return { run: runs, name: file.originalname, size: file.size };
  }

  @Post('avatars/elsewhere')
  @NoRepeatSubmit()
  @UseInterceptors(FileInterceptor('file', { storage: elsewhere }))
  avatarElsewhere() {
    runs++;
    return { run: runs };
  }

  /** Several files in several fields (`req.files`, an array in the order they came). */
  @Post('albums')
  @NoRepeatSubmit()
  @UseInterceptors(AnyFilesInterceptor())
  album(@UploadedFiles() files: { fieldname: string }[]) {
    runs++;
    return { run: runs, fields: files.map((f) => f.fieldname) };
  }

  /** The body a fingerprint-keyed route sees; the user comes from X-User. */
  @Post('fingerprinted')
  @NoRepeatSubmit({ useRequestFingerprint: true })
  fingerprinted(@Body() body: unknown) {
    runs++;
    return { run: runs, body };
  }

  /** A handler that reads the request stream itself. */
  @Post('streams')
  @HttpCode(200)
  @NoRepeatSubmit()
  async stream(@Req() req: AsyncIterable<Buffer>) {
    let bytes = 0;
    for await (const chunk of req) bytes += chunk.length;
    runs++;
    return { run: runs, bytes };
  }

  /** A key is welcome but optional: a call without one runs unguarded (README, `required: false`). */
  @Post('notes')
  @NoRepeatSubmit({ required: false })
  note(@Body() body: unknown) {
    runs++;
    return { run: runs, type: typeof body };
  }

  /** A bodiless action: POST /orders/:id/cancel. */
  @Post('orders/:id/cancel')
  @HttpCode(200)
  @NoRepeatSubmit()
  cancel(@Param('id') id: string) {
    runs++;
    return { run: runs, cancelled: id };
  }

  @Get('reports/:id')
  @NoRepeatSubmit()
  report(@Param('id') id: string) {
    runs++;
    return { run: runs, report: id };
  }

  @Delete('orders/:id')
  @NoRepeatSubmit()
  remove(@Param('id') id: string, @Body() body: unknown) {
    runs++;
    return { run: runs, removed: id, body };
  }

  @Post('blobs')
  @NoRepeatSubmit()
  blob(@Body() body: Buffer) {
    runs++;
    return { run: runs, bytes: Buffer.isBuffer(body) ? body.length : -1 };
  }

  @Post('text')
  @NoRepeatSubmit()
  text(@Body() body: unknown) {
    runs++;
    return { run: runs, body };
  }
}

async function start(adapter: 'express' | 'fastify', rawBody = false, keyPrefix = `body-parsers-${randomUUID().slice(0, 8)}`): Promise<INestApplication> {
  @Module({
    imports: [
      IdempotencyModule.forRoot({
        store: { redis: REDIS_URL },
        keyPrefix,
        getUser: (ctx) => ctx.switchToHttp().getRequest<{ headers: Record<string, string | undefined> }>().headers['x-user'],
      }),
    ],
    controllers: [UploadsController],
  })
  class AppModule {}
  let app: INestApplication;
  if (adapter === 'express') {
    const express = await NestFactory.create<NestExpressApplication>(AppModule, new ExpressAdapter(), { logger: ['error'], rawBody });
    express.useBodyParser('text');
    express.useBodyParser('json', { type: 'application/csp-report' });
    express.useBodyParser('raw', { type: 'application/octet-stream', limit: '16mb' });
    app = express;
  } else {
    app = await NestFactory.create<NestFastifyApplication>(AppModule, new FastifyAdapter(), { logger: ['error'], rawBody });
  }
  await app.listen(0, '127.0.0.1');
  return app;
}

const urlOf = (app: INestApplication) => `http://127.0.0.1:${(app.getHttpServer().address() as { port: number }).port}`;

/** A request whose body goes out with `Transfer-Encoding: chunked` (headers flushed before the body), as a streaming proxy relays it. */
function chunked(url: string, path: string, headers: Record<string, string>, body = ''): Promise<{ status: number; text: string }> {
  return new Promise((resolve, reject) => {
    const req = httpRequest(`${url}${path}`, { method: 'POST', headers, agent: false }, (res) => {
      const chunks: Buffer[] = [];
      res.on('data', (c: Buffer) => chunks.push(c));
      res.on('end', () => resolve({ status: res.statusCode ?? 0, text: Buffer.concat(chunks).toString('utf8') }));
    });
    req.on('error', reject);
    req.flushHeaders();
    setTimeout(() => req.end(body), 20);
  });
}

describe('body parsers without rawBody (express)', () => {
  let app: INestApplication;
  let withRaw: INestApplication;
  beforeAll(async () => {
    // One key prefix: a record one app writes is what the other finds (a retry across the upgrade).
    const keyPrefix = `body-parsers-${randomUUID().slice(0, 8)}`;
    app = await start('express', false, keyPrefix);
    withRaw = await start('express', true, keyPrefix);
  });
  afterAll(async () => {
    await app?.close();
    await withRaw?.close();
    rmSync(UPLOAD_DIR, { recursive: true, force: true });
  });

  it('multipart through FileInterceptor: another file under the same key is not replayed the first file\'s answer (422)', async () => {
    const key = randomUUID();
    const upload = (content: string) =>
      request(app.getHttpServer())
        .post('/avatars')
        .set('idempotency-key', key)
        .field('caption', 'me')
        .attach('file', Buffer.from(content), { filename: 'a.txt', contentType: 'text/plain' });
    const first = await upload('FIRST FILE');
    expect(first.status).toBe(201);
    const other = await upload('A COMPLETELY DIFFERENT FILE');
    // Before the fix: 201, Idempotent-Replayed: true, body { bytes: 'FIRST FILE' }: the second file was dropped silently.
    expect({ status: other.status, replayed: other.headers['idempotent-replayed'], code: other.body.code }).toEqual({
      status: 422,
      replayed: undefined,
      code: 'IDEMPOTENCY_KEY_REUSED',
    });
  });

  it('multipart text fields whose bracket names nest into an object shaped like a @fastify/multipart part are text fields (422 for another value)', async () => {
    const key = randomUUID();
    const upload = (fields: [string, string][]) => {
      const req = request(app.getHttpServer()).post('/avatars').set('idempotency-key', key);
      for (const [name, value] of fields) req.field(name, value);
      return req.attach('file', Buffer.from('F'), { filename: 'a.txt', contentType: 'text/plain' });
    };
    expect((await upload([['q[type]', 'field'], ['q[fieldname]', 'email'], ['q[value]', 'v']])).status).toBe(201);
    // Before the fix (c05116d): 201 replayed: the nested object was taken for a field part whose value is 'v'.
    expect((await upload([['q', 'v']])).status).toBe(422);
    // And one shaped like a file part was refused 400 for bytes a plugin did not buffer.
    const fileShaped = await upload([['f[0][type]', 'file'], ['f[0][fieldname]', 'cv']]);
    expect({ status: fileShaped.status, code: fileShaped.body.code }).toEqual({ status: 422, code: 'IDEMPOTENCY_KEY_REUSED' });
  });

  it('required: false: a call without a key runs unguarded whatever its body, never 400', async () => {
    const before = runs;
    const answer = await request(app.getHttpServer()).post('/notes').set('content-type', 'application/xml').send('<note>hi</note>');
    // Before the fix: 400 IDEMPOTENCY_PAYLOAD_UNSUPPORTED although the call has no key and the guard has nothing to do.
    expect({ status: answer.status, code: answer.body.code }).toEqual({ status: 201, code: undefined });
    expect(runs - before).toBe(1);
  });

  it('a bodiless POST relayed with Transfer-Encoding: chunked (no Content-Type, zero bytes) is not refused as an unread body', async () => {
    const key = randomUUID();
    const first = await chunked(urlOf(app), '/orders/7/cancel', { 'idempotency-key': key });
    // Before the fix: 400 IDEMPOTENCY_PAYLOAD_UNSUPPORTED ("no body parser read its body") for an empty body.
    expect(first.status).toBe(200);
    const again = await chunked(urlOf(app), '/orders/7/cancel', { 'idempotency-key': key });
    expect(again.status).toBe(200);
  });

  it('a JSON body parsed under a type other than application/json (csp-report): a retry across the rawBody upgrade replays', async () => {
    const key = randomUUID();
    const report = '{"csp-report":{"blocked-uri":"https://evil.example"}}';
    const post = (target: INestApplication) =>
      request(target.getHttpServer()).post('/text').set('idempotency-key', key).set('content-type', 'application/csp-report').send(report);
    expect((await post(withRaw)).status).toBe(201);
    const retry = await post(app);
    // Before the fix: 422 IDEMPOTENCY_KEY_REUSED: with rawBody the bytes were hashed, without it the parsed object.
    expect({ status: retry.status, replayed: retry.headers['idempotent-replayed'] }).toEqual({ status: 201, replayed: 'true' });
  });

  it('regression: a 12 MiB octet-stream body: the same bytes replay, across the rawBody upgrade too; one byte changed at the end is 422', async () => {
    const key = randomUUID();
    const bytes = Buffer.alloc(12 * 1024 * 1024, 0x61);
    const post = (target: INestApplication, body: Buffer) =>
      request(target.getHttpServer()).post('/blobs').set('idempotency-key', key).set('content-type', 'application/octet-stream').send(body);
    const first = await post(withRaw, bytes);
    expect([first.status, first.body.bytes]).toEqual([201, bytes.length]);
    expect((await post(app, bytes)).headers['idempotent-replayed']).toBe('true');
    const last = Buffer.from(bytes);
    last[last.length - 1] = 0x62;
    expect((await post(app, last)).status).toBe(422);
  });

  it('regression: an empty text/plain body: one fingerprint with and without rawBody', async () => {
    const key = randomUUID();
    const post = (target: INestApplication) =>
      request(target.getHttpServer()).post('/text').set('idempotency-key', key).set('content-type', 'text/plain').send('');
    expect((await post(withRaw)).status).toBe(201);
    expect((await post(app)).headers['idempotent-replayed']).toBe('true');
  });

  it('text sent as Latin-1 without a charset ("café" vs "cafè"): two different bodies under one key are not one request', async () => {
    const key = randomUUID();
    const post = (text: string) =>
      request(app.getHttpServer()).post('/text').set('idempotency-key', key).set('content-type', 'text/plain').send(Buffer.from(text, 'latin1'));
    const cafe = await post('order: café');
    expect(cafe.status).toBe(201);
    const other = await post('order: cafè');
    // Before the fix: 201 replayed. Both decode to "order: caf\uFFFD" and the string's UTF-8 was hashed; with rawBody: 422.
    // Neither can be matched to the other: refused, not replayed, and not told to take a new key.
    expect({ status: other.status, code: other.body.code, replayed: other.headers['idempotent-replayed'] }).toEqual({
      status: 400,
      code: 'IDEMPOTENCY_PAYLOAD_UNSUPPORTED',
      replayed: undefined,
    });
  });

  it('text decoded from UTF-16 holding a lone surrogate: another surrogate under the key is 422, the same text replays', async () => {
    const key = randomUUID();
    const utf16 = (surrogate: number) => Buffer.from(Uint16Array.from([...'to:'].map((c) => c.charCodeAt(0)).concat(surrogate, ...[...' 100'].map((c) => c.charCodeAt(0)))).buffer);
    const post = (body: Buffer) =>
      request(app.getHttpServer()).post('/text').set('idempotency-key', key).set('content-type', 'text/plain; charset=utf-16le').send(body);
    expect((await post(utf16(0xd800))).status).toBe(201);
    // Before the fix: 201 replayed. Both were hashed as UTF-8, where each lone surrogate is U+FFFD's bytes.
    const other = await post(utf16(0xdc00));
    expect({ status: other.status, code: other.body.code }).toEqual({ status: 422, code: 'IDEMPOTENCY_KEY_REUSED' });
    expect((await post(utf16(0xd800))).headers['idempotent-replayed']).toBe('true');
  });

  it('multer disk storage: a file on disk is hashed from disk (same file replays, another is 422)', async () => {
    const key = randomUUID();
    const upload = (content: string) =>
      request(app.getHttpServer())
        .post('/avatars/on-disk')
        .set('idempotency-key', key)
        .attach('file', Buffer.from(content), { filename: 'a.txt', contentType: 'text/plain' });
    const first = await upload('FIRST FILE');
    expect(first.status).toBe(201);
    const again = await upload('FIRST FILE');
    expect([again.status, again.headers['idempotent-replayed'], again.body]).toEqual([201, 'true', first.body]);
    const other = await upload('OTHER FILE');
    expect([other.status, other.body.code]).toEqual([422, 'IDEMPOTENCY_KEY_REUSED']);
  });

  it('multer: the file name and type count too, and a file whose bytes no storage kept is refused 400', async () => {
    const key = randomUUID();
    const upload = (filename: string, contentType: string) =>
      request(app.getHttpServer())
        .post('/avatars')
        .set('idempotency-key', key)
        .field('caption', 'me')
        .attach('file', Buffer.from('SAME BYTES'), { filename, contentType });
    expect((await upload('a.txt', 'text/plain')).status).toBe(201);
    expect((await upload('b.txt', 'text/plain')).status).toBe(422);
    expect((await upload('a.txt', 'text/csv')).status).toBe(422);

    const before = runs;
    const lost = await request(app.getHttpServer())
      .post('/avatars/elsewhere')
      .set('idempotency-key', randomUUID())
      .attach('file', Buffer.from('x'), { filename: 'a.txt', contentType: 'text/plain' });
    expect([lost.status, lost.body.code]).toEqual([400, 'IDEMPOTENCY_PAYLOAD_UNSUPPORTED']);
    expect(lost.body.message).toMatch(/neither a buffer .*nor a path/);
    expect(runs).toBe(before);
  });

  it('multer: several files are hashed in their order', async () => {
    const key = randomUUID();
    const upload = (first: string, second: string) =>
      request(app.getHttpServer())
        .post('/albums')
        .set('idempotency-key', key)
        .attach('a', Buffer.from(first), { filename: 'a.txt', contentType: 'text/plain' })
        .attach('b', Buffer.from(second), { filename: 'b.txt', contentType: 'text/plain' });
    expect((await upload('one', 'two')).status).toBe(201);
    expect((await upload('one', 'two')).headers['idempotent-replayed']).toBe('true');
    expect((await upload('one', 'TWO')).status).toBe(422);
  });

  it('a required route answers a call without a key 400 IDEMPOTENCY_KEY_MISSING whatever its body, before looking at the body', async () => {
    const answer = await request(app.getHttpServer()).post('/text').set('content-type', 'application/xml').send('<note>hi</note>');
    expect({ status: answer.status, code: answer.body.code }).toEqual({ status: 400, code: 'IDEMPOTENCY_KEY_MISSING' });
  });

  it('a chunked body with bytes and no Content-Type is still refused; an empty one leaves the stream to a handler that reads it', async () => {
    const before = runs;
    const refused = await chunked(urlOf(app), '/orders/7/cancel', { 'idempotency-key': randomUUID() }, 'surprise');
    expect(refused.status).toBe(400);
    expect(JSON.parse(refused.text).code).toBe('IDEMPOTENCY_PAYLOAD_UNSUPPORTED');
    expect(runs).toBe(before);

    const key = randomUUID();
    const read = await chunked(urlOf(app), '/streams', { 'idempotency-key': key });
    expect([read.status, JSON.parse(read.text).bytes]).toEqual([200, 0]);
    const again = await chunked(urlOf(app), '/streams', { 'idempotency-key': key });
    expect([again.status, again.text]).toEqual([200, read.text]);
  });

  it('text its parser could not decode: a retry under its key is refused as unmatchable, never "send a new key" (its bytes are lost), and a fingerprint-keyed route refuses it', async () => {
    const key = randomUUID();
    const latin1 = Buffer.from('order: café', 'latin1');
    const post = (path: string, headers: Record<string, string>) =>
      request(app.getHttpServer()).post(path).set(headers).set('content-type', 'text/plain').send(latin1);
    expect((await post('/text', { 'idempotency-key': key })).status).toBe(201);
    const retry = await post('/text', { 'idempotency-key': key });
    // It was 422 IDEMPOTENCY_KEY_REUSED ("send a new key for a new operation"): a client that did so
    // ran the operation again (an adversarial helper: the first answer cut, the retry refused).
    expect([retry.status, retry.body.code]).toEqual([400, 'IDEMPOTENCY_PAYLOAD_UNSUPPORTED']);
    expect(retry.body.message).toMatch(/cannot be matched to the call that first used this key, which may have run/);

    const before = runs;
    const keyless = await post('/fingerprinted', { 'x-user': `u-${key}` });
    expect([keyless.status, keyless.body.code]).toEqual([400, 'IDEMPOTENCY_PAYLOAD_UNSUPPORTED']);
    expect(keyless.body.message).toContain(`app.useBodyParser('raw', { type: ['text/plain'] })`);
    expect(runs).toBe(before);
    // Declared as Latin-1, it is decoded and fingerprinted.
    const declared = () =>
      request(app.getHttpServer()).post('/fingerprinted').set('x-user', `u-${key}`).set('content-type', 'text/plain; charset=iso-8859-1').send(latin1);
    expect((await declared()).status).toBe(201);
    expect((await declared()).headers['idempotent-replayed']).toBe('true');
  });
});

describe('body parsers without rawBody (fastify)', () => {
  let app: INestApplication;
  beforeAll(async () => {
    app = await start('fastify');
  });
  afterAll(async () => app?.close());

  it('a guarded GET that carries a JSON body (Fastify never parses GET bodies; the handler sees none) is not refused 400', async () => {
    const key = randomUUID();
    const get = () =>
      request(app.getHttpServer()).get('/reports/1').set('idempotency-key', key).set('content-type', 'application/json').send('{"filter":"x"}');
    const first = await get();
    // Before the fix: 400 IDEMPOTENCY_PAYLOAD_UNSUPPORTED, telling the server to register a parser for application/json (it has one).
    expect({ status: first.status, code: first.body.code }).toEqual({ status: 200, code: undefined });
    expect((await get()).headers['idempotent-replayed']).toBe('true');
  });

  it('regression: DELETE with a JSON body is fingerprinted by it (another body: 422)', async () => {
    const key = randomUUID();
    const a = await request(app.getHttpServer()).delete('/orders/1').set('idempotency-key', key).send({ reason: 'a' });
    const b = await request(app.getHttpServer()).delete('/orders/1').set('idempotency-key', key).send({ reason: 'b' });
    expect({ a: a.status, b: b.status }).toEqual({ a: 200, b: 422 });
  });
});
