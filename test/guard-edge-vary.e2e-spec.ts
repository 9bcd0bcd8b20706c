// A replay's Vary, as apps wire CORS and compression. `Vary` says which request headers chose
// the answer, so whom a cache may give it to. The replay kept the saved `Cache-Control: public`
// but dropped the handler's `Vary: Authorization` (only CORS's `Vary: Origin` went out): a shared
// cache could serve one user's answer to anyone. On Fastify behind CORS, a compressed replay went
// out without `Vary: Accept-Encoding`: Fastify passes its own headers (CORS's `Vary: Origin`) to
// writeHead, over the one the guard set. (An adversarial helper, 4 of 4 on each.)
import { afterAll, beforeAll, describe, expect, it } from '@jest/globals';
import { Controller, Headers, Post, Res } from '@nestjs/common';
import compression from 'compression';
import { randomUUID } from 'node:crypto';
import { gzipSync } from 'node:zlib';
import { NoRepeatSubmit } from '../libs/idempotency/src/index.js';
import { makeApp, replayed, send, type Adapter, type EdgeApp, type RawAnswer } from './support/edge-app.js';

const runs = new Map<string, number>();

/** Express's response or Fastify's reply. */
interface HeaderSetter {
  setHeader?(name: string, value: string): void;
  header?(name: string, value: string): void;
  getHeader(name: string): unknown;
}

@Controller('balances')
class BalancesController {
  @Post()
  @NoRepeatSubmit()
  show(@Headers('idempotency-key') key: string, @Headers('authorization') authorization: string, @Res({ passthrough: true }) res: HeaderSetter) {
    runs.set(key, (runs.get(key) ?? 0) + 1);
    const set = (name: string, value: string) => (res.setHeader ? res.setHeader(name, value) : res.header!(name, value));
    set('Cache-Control', 'public, max-age=300');
    // Added to what CORS put there, as `res.vary()` and @fastify/compress do.
    const vary = res.getHeader('vary');
    set('Vary', vary ? `${String(vary)}, Authorization` : 'Authorization');
    return { user: authorization, balance: 42, lines: 'x'.repeat(2000) };
  }
}

const CORS = { origin: ['http://a.example', 'http://b.example'], credentials: true };

/** The fields a Vary names, lower-case. */
const varyOf = (answer: RawAnswer) =>
  String(answer.headers['vary'] ?? '')
    .split(',')
    .map((name) => name.trim().toLowerCase())
    .filter(Boolean)
    .sort();

type OnSend = (req: { headers: Record<string, string | undefined> }, reply: ReplyHeaders, payload: unknown) => Promise<unknown>;
interface ReplyHeaders {
  getHeader(k: string): unknown;
  header(k: string, v: string): void;
  removeHeader(k: string): void;
}

/** Compression as each adapter's apps add it: the `compression` middleware, or an onSend hook as @fastify/compress's (gzip, appending to Vary). */
function compressed(adapter: Adapter) {
  return (app: import('@nestjs/common').INestApplication) => {
    app.enableCors(CORS);
    if (adapter === 'express') {
      app.use(compression({ threshold: 0 }));
      return;
    }
    const fastify = app.getHttpAdapter().getInstance() as { addHook(name: 'onSend', hook: OnSend): void };
    fastify.addHook('onSend', async (req, reply, payload) => {
      if (!String(req.headers['accept-encoding'] ?? '').includes('gzip') || typeof payload !== 'string') return payload;
      reply.header('content-encoding', 'gzip');
      const vary = reply.getHeader('vary');
      reply.header('vary', vary ? `${String(vary)}, accept-encoding` : 'accept-encoding');
      reply.removeHeader('content-length');
      return gzipSync(payload);
    });
  };
}

describe.each<Adapter>(['express', 'fastify'])('%s: a replay varies as the first answer did', (adapter) => {
  let plain: EdgeApp;
  let packed: EdgeApp;
  beforeAll(async () => {
    plain = await makeApp(adapter, [BalancesController], {}, { setup: (app) => app.enableCors(CORS) });
    packed = await makeApp(adapter, [BalancesController], {}, { setup: compressed(adapter) });
  });
  afterAll(async () => {
    await plain?.close();
    await packed?.close();
  });

  it("the handler's Vary goes with the saved Cache-Control, beside CORS's Origin", async () => {
    const key = randomUUID();
    const asked = { authorization: 'Bearer u1', origin: 'http://a.example' };
    const first = await send(plain.url, '/balances', { key, headers: asked });
    const replay = await send(plain.url, '/balances', { key, headers: { ...asked, origin: 'http://b.example' } });
    expect(varyOf(first)).toEqual(['authorization', 'origin']);
    expect(replayed(replay)).toBe(true);
    expect(replay.headers['cache-control']).toBe('public, max-age=300');
    expect(varyOf(replay)).toEqual(['authorization', 'origin']);
    expect(replay.headers['access-control-allow-origin']).toBe('http://b.example');
    expect(runs.get(key)).toBe(1);
  });

  it.each([
    ['a gzip client', { 'accept-encoding': 'gzip' }, 'gzip'],
    ['a client that names no coding (decoded for it)', {}, undefined],
  ])('a compressed answer replayed to %s varies with Accept-Encoding and Origin', async (_name, replayAccepts: Record<string, string>, coding) => {
    const key = randomUUID();
    const asked = { authorization: 'Bearer u1', origin: 'http://a.example' };
    const first = await send(packed.url, '/balances', { key, headers: { ...asked, 'accept-encoding': 'gzip' } });
    const replay = await send(packed.url, '/balances', { key, headers: { ...asked, ...replayAccepts } });
    expect(first.headers['content-encoding']).toBe('gzip');
    expect(varyOf(first)).toEqual(['accept-encoding', 'authorization', 'origin']);
    expect(replayed(replay)).toBe(true);
    expect(replay.headers['content-encoding']).toBe(coding);
    expect(varyOf(replay)).toEqual(['accept-encoding', 'authorization', 'origin']);
    expect(runs.get(key)).toBe(1);
  });
});
