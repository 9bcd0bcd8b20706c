// Headers an app sets when the head is written: a middleware that wraps `writeHead` (as
// on-headers does, which compression, express-session and response-time use) and sets a cache
// policy from what the handler decided. Express's `res.send` ends without a head, so the guard,
// holding the bytes, read the headers for its record before Node wrote the head: a private
// answer's `Cache-Control: private, no-store` and its `Content-Location` went to the first
// client and never to its replays, which a shared cache may then store (an adversarial helper:
// 10 of 10 keys on Express; Fastify writes its head before the body, and held).
import { afterAll, beforeAll, describe, expect, it } from '@jest/globals';
import { Controller, Post, Res } from '@nestjs/common';
import type { ServerResponse } from 'node:http';
import { randomUUID } from 'node:crypto';
import { NoRepeatSubmit } from '../libs/idempotency/src/index.js';
import { makeApp, replayed, send, type Adapter, type EdgeApp } from './support/edge-app.js';

const PRIVATE = Symbol('private answer');
type Marked = ServerResponse & { [PRIVATE]?: string };
/** The Node.js response under Express's `res` or Fastify's reply. */
const nodeResponse = (res: { raw?: ServerResponse } & object) => (res.raw ?? res) as Marked;

let runs = 0;

/** A cache policy decided when the head is written, as an on-headers listener decides it. */
function cachePolicy(_req: unknown, res: Marked, next: () => void) {
  const writeHead = res.writeHead;
  res.writeHead = function (this: Marked, ...args: unknown[]) {
    if (this[PRIVATE]) {
      this.setHeader('Cache-Control', 'private, no-store');
      this.setHeader('Content-Location', `/me/${this[PRIVATE]}`);
    }
    return (writeHead as (...a: unknown[]) => ServerResponse).apply(this, args);
  } as ServerResponse['writeHead'];
  next();
}

@Controller('account')
class AccountController {
  @Post('passthrough')
  @NoRepeatSubmit()
  passthrough(@Res({ passthrough: true }) res: object) {
    runs++;
    nodeResponse(res)[PRIVATE] = `u${runs}`;
    return { user: `u${runs}`, balance: 100 + runs };
  }

  @Post('written')
  @NoRepeatSubmit()
  written(@Res() res: { raw?: ServerResponse }) {
    runs++;
    const raw = nodeResponse(res);
    raw[PRIVATE] = `u${runs}`;
    raw.setHeader('Content-Type', 'text/plain');
    raw.write(`user u${runs}\n`);
    raw.end(`balance ${100 + runs}\n`);
  }

  /** One end() with the whole body and no length: Node sends its length, with or without the guard. */
  @Post('ended')
  @NoRepeatSubmit()
  ended(@Res() res: { raw?: ServerResponse }) {
    runs++;
    const raw = nodeResponse(res);
    raw[PRIVATE] = `u${runs}`;
    raw.setHeader('Content-Type', 'text/plain');
    raw.end(`user u${runs}, balance ${100 + runs}\n`);
  }
}

describe.each(['express', 'fastify'] as Adapter[])('headers set when the head is written (%s)', (adapter) => {
  let a: EdgeApp;
  beforeAll(async () => {
    a = await makeApp(adapter, [AccountController], {}, { setup: (app) => void app.use(cachePolicy) });
  });
  afterAll(async () => a?.close());

  it.each(['passthrough', 'written', 'ended'])('replays them with the answer of a %s route, once', async (route) => {
    for (let i = 0; i < 5; i++) {
      const key = randomUUID();
      const before = runs;
      const first = await send(a.url, `/account/${route}`, { key });
      const replay = await send(a.url, `/account/${route}`, { key });
      expect(first.headers['cache-control']).toBe('private, no-store');
      expect(replayed(replay)).toBe(true);
      expect(replay.status).toBe(first.status);
      expect(replay.text).toBe(first.text);
      expect(replay.headers['cache-control']).toBe('private, no-store');
      expect(replay.headers['content-location']).toBe(first.headers['content-location']);
      expect(runs - before).toBe(1);
      if (route !== 'ended') continue;
      expect([first.headers['content-length'], first.headers['transfer-encoding']]).toEqual([String(first.body.length), undefined]);
    }
  });
});
