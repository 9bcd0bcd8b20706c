// Fastify compression the way @fastify/compress does it: an onSend hook that gzips the
// payload when the request accepts gzip and sets Content-Encoding. The guard captures the bytes on
// reply.raw (compressed or not, depending on the FIRST request's Accept-Encoding) without their
// Content-Encoding, and a replay sends them under the REPLAY's negotiated encoding: gzip bytes
// labelled as plain JSON, or plain JSON labelled gzip.
import { afterAll, beforeAll, describe, expect, it } from '@jest/globals';
import { Controller, Post } from '@nestjs/common';
import { randomUUID } from 'node:crypto';
import { gunzipSync, gzipSync } from 'node:zlib';
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
}

type Hook = (req: { headers: Record<string, string | undefined> }, reply: { header(k: string, v: string): void; removeHeader(k: string): void }, payload: unknown) => Promise<unknown>;

/** What the client reads: the body decoded by its Content-Encoding. */
function decoded(answer: RawAnswer): string {
  if (answer.headers['content-encoding'] !== 'gzip') return answer.body.toString('utf8');
  try {
    return gunzipSync(answer.body).toString('utf8');
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
        fastify.addHook('onSend', async (req, reply, payload) => {
          if (!String(req.headers['accept-encoding'] ?? '').includes('gzip') || typeof payload !== 'string') return payload;
          reply.header('content-encoding', 'gzip');
          reply.header('vary', 'accept-encoding');
          reply.removeHeader('content-length');
          return gzipSync(payload);
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
});
