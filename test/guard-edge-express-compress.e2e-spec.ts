// Express with the `compression` middleware, as apps wire it (`app.use(compression())`). It wraps
// the response's writeHead, write and end before the guard does, so the guard sees the bytes the
// app writes, before compression encodes them. A `@Res()` handler that sends its head first
// (`writeHead`, `flushHeaders`: streamed exports) had compression label the response `br` inside
// that writeHead, and the guard saved that label with the plain bytes: every replay said `br`
// over bytes no client could decode (an adversarial helper; also to a client that accepts no
// coding). The saved coding is the one the app gave its bytes.
import { afterAll, beforeAll, describe, expect, it } from '@jest/globals';
import { Controller, Post, Res } from '@nestjs/common';
import compression from 'compression';
import type { Response } from 'express';
import { randomUUID } from 'node:crypto';
import { brotliDecompressSync, gunzipSync, gzipSync } from 'node:zlib';
import { NoRepeatSubmit } from '../libs/idempotency/src/index.js';
import { makeApp, replayed, send, type EdgeApp, type RawAnswer } from './support/edge-app.js';

const runs = new Map<string, number>();
const ran = (route: string) => {
  const run = (runs.get(route) ?? 0) + 1;
  runs.set(route, run);
  return run;
};
/** Above compression's 1 KB threshold. */
const lines = (run: number) => `order ${run}\n` + 'order line,1,2,3\n'.repeat(200);

@Controller('exports')
class ExportsController {
  @Post('head-first')
  @NoRepeatSubmit()
  headFirst(@Res() res: Response) {
    res.writeHead(200, { 'Content-Type': 'text/plain; charset=utf-8' });
    res.end(lines(ran('head-first')));
  }

  @Post('flushed')
  @NoRepeatSubmit()
  flushed(@Res() res: Response) {
    const run = ran('flushed');
    res.setHeader('Content-Type', 'text/csv');
    res.flushHeaders();
    for (let i = 0; i < 100; i++) res.write(`order,${run},${i}\n`);
    res.end();
  }

  @Post('sent')
  @NoRepeatSubmit()
  sent(@Res() res: Response) {
    res.type('text/plain').send(lines(ran('sent')));
  }

  /** Bytes the handler encoded itself: their coding is the handler's, and stays. */
  @Post('own-gzip')
  @NoRepeatSubmit()
  ownGzip(@Res() res: Response) {
    res.writeHead(200, { 'Content-Type': 'text/plain', 'Content-Encoding': 'gzip' });
    res.end(gzipSync(lines(ran('own-gzip'))));
  }

  @Post('own-gzip-set')
  @NoRepeatSubmit()
  ownGzipSet(@Res() res: Response) {
    res.setHeader('Content-Type', 'text/plain');
    res.setHeader('Content-Encoding', 'gzip');
    res.flushHeaders();
    res.end(gzipSync(lines(ran('own-gzip-set'))));
  }
}

/** What the client reads: the body decoded by its Content-Encoding. */
function decoded(answer: RawAnswer): string {
  const coding = answer.headers['content-encoding'];
  try {
    if (coding === 'gzip') return gunzipSync(answer.body).toString('utf8');
    if (coding === 'br') return brotliDecompressSync(answer.body).toString('utf8');
  } catch (error) {
    return `undecodable ${coding}: ${(error as Error).message}`;
  }
  return answer.body.toString('utf8');
}

describe('Express with the compression middleware', () => {
  let a: EdgeApp;
  beforeAll(async () => {
    a = await makeApp('express', [ExportsController], {}, { setup: (app) => void app.use(compression()) });
  });
  afterAll(async () => a?.close());

  describe.each(['head-first', 'flushed', 'sent', 'own-gzip', 'own-gzip-set'])('a route that answers %s', (route) => {
    it.each([
      ['brotli', 'gzip, deflate, br'],
      ['gzip', 'gzip'],
      ['no coding', undefined],
    ])('replays to clients that take %s what the first caller read, once', async (_name, accepts) => {
      const key = randomUUID();
      const before = runs.get(route) ?? 0;
      const first = await send(a.url, `/exports/${route}`, { key, headers: { 'accept-encoding': 'gzip, deflate, br' } });
      expect([200, 201]).toContain(first.status);
      const replay = await send(a.url, `/exports/${route}`, { key, headers: accepts === undefined ? {} : { 'accept-encoding': accepts } });
      expect(replayed(replay)).toBe(true);
      expect(replay.status).toBe(first.status);
      // Observed before on head-first and flushed: "undecodable br: Decompression failed".
      expect(decoded(replay)).toBe(decoded(first));
      expect(decoded(first)).toMatch(/^order/);
      expect((runs.get(route) ?? 0) - before).toBe(1);
    });
  });
});
