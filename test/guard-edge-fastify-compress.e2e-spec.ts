// Fastify compression the way @fastify/compress does it: an onSend hook that gzips the
// payload when the request accepts gzip and sets Content-Encoding. The guard captures the bytes on
// reply.raw (compressed or not, depending on the FIRST request's Accept-Encoding) without their
// Content-Encoding, and a replay sends them under the REPLAY's negotiated encoding: gzip bytes
// labelled as plain JSON, or plain JSON labelled gzip. The saved coding must also suit the
// duplicate: brotli bytes to a client that accepts only gzip, or gzip to one that wants identity,
// are bytes it cannot read; and a compressed replay must vary with Accept-Encoding.
import { afterAll, beforeAll, describe, expect, it } from '@jest/globals';
import { Controller, HttpCode, Post } from '@nestjs/common';
import { randomUUID } from 'node:crypto';
import { brotliCompressSync, brotliDecompressSync, gunzipSync, gzipSync } from 'node:zlib';
import { NoRepeatSubmit } from '../libs/idempotency/src/index.js';
import { makeApp, replayed, send, type EdgeApp, type RawAnswer } from './support/edge-app.js';

let runs = 0;

@Controller('orders')
class OrdersController {
  @Post()
  @NoRepeatSubmit()
  create() {
    runs++;
    return { order: runs, lines: 'x'.repeat(200) };
  }

  @Post('reset')
  @HttpCode(205)
  @NoRepeatSubmit()
  reset() {
    runs++;
    return '';
  }
}

type Hook = (req: { headers: Record<string, string | undefined> }, reply: { header(k: string, v: string): void; removeHeader(k: string): void }, payload: unknown) => Promise<unknown>;

/** What the client reads: the body decoded by its Content-Encoding. */
function decoded(answer: RawAnswer): string {
  const coding = answer.headers['content-encoding'];
  if (coding !== 'gzip' && coding !== 'br') return answer.body.toString('utf8');
  try {
    return (coding === 'gzip' ? gunzipSync(answer.body) : brotliDecompressSync(answer.body)).toString('utf8');
  } catch (error) {
    return `undecodable: ${(error as Error).message}`;
  }
}

describe('Fastify with onSend compression', () => {
  let a: EdgeApp;
  beforeAll(async () => {
    a = await makeApp('fastify', [OrdersController], {}, {
      setup: (app) => {
        const fastify = app.getHttpAdapter().getInstance() as { addHook(name: 'onSend', hook: Hook): void };
        // As @fastify/compress: brotli when the request accepts it, else gzip.
        fastify.addHook('onSend', async (req, reply, payload) => {
          const accepted = String(req.headers['accept-encoding'] ?? '');
          const coding = accepted.includes('br') ? 'br' : accepted.includes('gzip') ? 'gzip' : undefined;
          if (!coding || typeof payload !== 'string') return payload;
          reply.header('content-encoding', coding);
          reply.header('vary', 'accept-encoding');
          reply.removeHeader('content-length');
          return coding === 'br' ? brotliCompressSync(payload) : gzipSync(payload);
        });
      },
    });
  });
  afterAll(async () => a?.close());

  it.each([
    ['a gzip client first, then a plain one', { 'accept-encoding': 'gzip' }, {}],
    ['a plain client first, then a gzip one', {}, { 'accept-encoding': 'gzip' }],
  ])('%s: the replay decodes to the first answer', async (_name, firstHeaders: Record<string, string>, replayHeaders: Record<string, string>) => {
    const key = randomUUID();
    const first = await send(a.url, '/orders', { key, headers: firstHeaders });
    const replay = await send(a.url, '/orders', { key, headers: replayHeaders });
    expect(replayed(replay)).toBe(true);
    expect(decoded(replay)).toBe(decoded(first));
  });

  it.each([
    ['brotli first, then a client that takes gzip or deflate', 'br, gzip, deflate', 'gzip, deflate', ['gzip', 'deflate', undefined]],
    ['gzip first, then a client that wants identity', 'gzip', 'identity', [undefined]],
    ['gzip first, then a client that names no coding', 'gzip', undefined, [undefined]],
    ['gzip first, then a client that refuses gzip', 'gzip', 'gzip;q=0, identity', [undefined]],
    ['brotli first, then a client that takes anything', 'br', '*', ['br']],
  ])('%s: the replay comes in a coding it accepts', async (_name, firstAccepts, replayAccepts, codings) => {
    const key = randomUUID();
    const first = await send(a.url, '/orders', { key, headers: { 'accept-encoding': firstAccepts } });
    const replay = await send(a.url, '/orders', { key, headers: replayAccepts === undefined ? {} : { 'accept-encoding': replayAccepts } });
    expect(first.headers['content-encoding']).toBe(firstAccepts.split(',')[0]);
    expect(replayed(replay)).toBe(true);
    expect(codings).toContain(replay.headers['content-encoding']);
    expect(decoded(replay)).toBe(decoded(first));
    expect(Number(replay.headers['content-length'])).toBe(replay.body.length);
  });

  it('a compressed replay varies with Accept-Encoding (a shared cache must not serve it to everyone)', async () => {
    const key = randomUUID();
    await send(a.url, '/orders', { key, headers: { 'accept-encoding': 'gzip' } });
    const replay = await send(a.url, '/orders', { key, headers: { 'accept-encoding': 'gzip' } });
    expect(replay.headers['content-encoding']).toBe('gzip');
    expect(String(replay.headers.vary ?? '').toLowerCase()).toContain('accept-encoding');
  });

  // An adversarial helper: a compression plugin with no threshold gzips a 205's empty answer; a
  // replay sends no body (205 has none) and still said `Content-Encoding: gzip`, to a client that
  // takes no coding too. No body, no coding.
  it('replays a 205 without a coding for a body it does not send', async () => {
    const key = randomUUID();
    const before = runs;
    const first = await send(a.url, '/orders/reset', { key, headers: { 'accept-encoding': 'gzip' } });
    const replay = await send(a.url, '/orders/reset', { key });
    expect([first.status, replay.status, replayed(replay), replay.body.length]).toEqual([205, 205, true, 0]);
    expect(replay.headers['content-encoding']).toBeUndefined();
    expect(runs - before).toBe(1);
  });
});
