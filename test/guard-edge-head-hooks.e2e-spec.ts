// Headers an app sets when the head is written: a middleware that wraps `writeHead` (as
// on-headers does, which compression, express-session and response-time use) and sets a cache
// policy from what the handler decided. Express's `res.send` ends without a head, so the guard,
// holding the bytes, read the headers for its record before Node wrote the head: a private
// answer's `Cache-Control: private, no-store` and its `Content-Location` went to the first
// client and never to its replays, which a shared cache may then store (an adversarial helper:
// 10 of 10 keys on Express; Fastify writes its head before the body, and held). The head is now
// written first, through the response's writeHead as it is then (a wrapper a handler added too),
// with no length of the guard's: a middleware may still rewrite the bytes (a second helper: a
// redactor behind a length counted before it, a 204 with a length, a handler's own wrapper
// skipped).
import { afterAll, beforeAll, describe, expect, it } from '@jest/globals';
import { Controller, Post, Res } from '@nestjs/common';
import type { ServerResponse } from 'node:http';
import { randomUUID } from 'node:crypto';
import { NoRepeatSubmit } from '../libs/idempotency/src/index.js';
import { makeApp, replayed, send, type Adapter, type EdgeApp, type RawAnswer } from './support/edge-app.js';

const PRIVATE = Symbol('private answer');
const NO_CONTENT = Symbol('no content');
const REFUSED = Symbol('a header Node refuses');
type Marked = ServerResponse & { [PRIVATE]?: string; [NO_CONTENT]?: boolean; [REFUSED]?: boolean };
/** The Node.js response under Express's `res` or Fastify's reply. */
const nodeResponse = (res: object) => ((res as { raw?: ServerResponse }).raw ?? res) as Marked;

let runs = 0;

/** Wraps the response's writeHead to set a cache policy when the head is written, as an on-headers listener does. */
function onHead(res: Marked) {
  const writeHead = res.writeHead;
  res.writeHead = function (this: Marked, ...args: unknown[]) {
    if (this[PRIVATE]) {
      this.setHeader('Cache-Control', 'private, no-store');
      this.setHeader('Content-Location', `/me/${this[PRIVATE]}`);
    }
    if (this[NO_CONTENT]) this.statusCode = 204;
    if (this[REFUSED]) this.setHeader('X-Customer', 'Ann\nEvil');
    // As on-headers does: a status the listener set replaces the one asked for.
    if (typeof args[0] === 'number' && args[0] !== this.statusCode) args[0] = this.statusCode;
    return (writeHead as (...a: unknown[]) => ServerResponse).apply(this, args);
  } as ServerResponse['writeHead'];
}

function cachePolicy(_req: unknown, res: Marked, next: () => void) {
  onHead(res);
  next();
}

/** Masks card numbers in the text written through `end()`, as a redacting middleware does: the bytes change length after the guard saw them. */
function redactor(_req: unknown, res: Marked, next: () => void) {
  const end = res.end;
  res.end = function (this: Marked, chunk?: unknown, ...rest: unknown[]) {
    const text = typeof chunk === 'string' ? chunk.replace(/\d{12}(\d{4})/g, '****$1') : chunk;
    return (end as (...a: unknown[]) => ServerResponse).call(this, text, ...rest);
  } as ServerResponse['end'];
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
  written(@Res() res: object) {
    runs++;
    const raw = nodeResponse(res);
    raw[PRIVATE] = `u${runs}`;
    raw.setHeader('Content-Type', 'text/plain');
    raw.write(`user u${runs}\n`);
    raw.end(`balance ${100 + runs}\n`);
  }

  /** One end() with the whole body and no length. */
  @Post('ended')
  @NoRepeatSubmit()
  ended(@Res() res: object) {
    runs++;
    const raw = nodeResponse(res);
    raw[PRIVATE] = `u${runs}`;
    raw.setHeader('Content-Type', 'text/plain');
    raw.end(`user u${runs}, card 4111111111111111, balance ${100 + runs}\n`);
  }

  /** The handler adds its own head-time listener, after the guard was put on the response. */
  @Post('inner')
  @NoRepeatSubmit()
  inner(@Res({ passthrough: true }) res: object) {
    runs++;
    const raw = nodeResponse(res);
    onHead(raw);
    raw[PRIVATE] = `u${runs}`;
    return { user: `u${runs}` };
  }

  /** A head-time listener sets a header value Node refuses, on the first run only. */
  @Post('refused')
  @NoRepeatSubmit()
  refused(@Res({ passthrough: true }) res: object) {
    runs++;
    if (runs % 2 === 1) nodeResponse(res)[REFUSED] = true;
    return { run: runs };
  }

  /** A head-time listener turns the answer into a 204: it carries no length. */
  @Post('emptied')
  @NoRepeatSubmit()
  emptied(@Res() res: object) {
    runs++;
    const raw = nodeResponse(res);
    raw[NO_CONTENT] = true;
    raw.end('ignored');
  }
}

/** The body as framed: no Content-Length, or one that counts exactly the bytes received. */
const framed = (answer: RawAnswer) => answer.headers['content-length'] === undefined || Number(answer.headers['content-length']) === answer.body.length;

describe.each(['express', 'fastify'] as Adapter[])('headers set when the head is written (%s)', (adapter) => {
  let a: EdgeApp;
  let bare: EdgeApp;
  beforeAll(async () => {
    a = await makeApp(adapter, [AccountController], {}, { setup: (app) => void app.use(cachePolicy).use(redactor) });
    bare = await makeApp(adapter, [AccountController]);
  });
  afterAll(async () => Promise.all([a?.close(), bare?.close()]));

  it.each([
    ['passthrough', () => a],
    ['written', () => a],
    ['ended', () => a],
    ['inner', () => a],
    ['inner', () => bare],
  ])('replays them with the answer of a %s route, once, its length true', async (route, app) => {
    for (let i = 0; i < 5; i++) {
      const key = randomUUID();
      const before = runs;
      const first = await send(app().url, `/account/${route}`, { key });
      const replay = await send(app().url, `/account/${route}`, { key });
      expect(first.headers['cache-control']).toBe('private, no-store');
      expect(replayed(replay)).toBe(true);
      expect(replay.status).toBe(first.status);
      expect(replay.headers['cache-control']).toBe('private, no-store');
      expect(replay.headers['content-location']).toBe(first.headers['content-location']);
      expect(runs - before).toBe(1);
      expect([framed(first), first.error]).toEqual([true, undefined]);
      if (route === 'ended') expect(first.text).toMatch(/card \*{4}1111/);
      else expect(replay.text).toBe(first.text);
    }
  });

  // The same helper: refused before the save, the answer was recorded as never delivered and
  // every retry got 409 NOT_REPLAYABLE although the handler had run. Left to Node's end() now,
  // as before: the first client's response fails (as without the guard), a retry is replayed.
  // Express only: Fastify writes its head itself, the error is Fastify's to handle.
  it('replays the answer whose head a listener made Node refuse, once', async () => {
    if (adapter === 'fastify') return;
    if (runs % 2 === 1) runs++;
    const key = randomUUID();
    const before = runs;
    const first = await send(a.url, '/account/refused', { key });
    const replay = await send(a.url, '/account/refused', { key });
    expect(first.status === 0 || first.status >= 500 || first.error !== undefined).toBe(true);
    expect([replay.status, replayed(replay), runs - before]).toEqual([201, true, 1]);
  });

  it('sends a 204 a head-time listener made without a length', async () => {
    const first = await send(a.url, '/account/emptied', { key: randomUUID() });
    expect([first.status, first.headers['content-length'], first.body.length]).toEqual([204, undefined, 0]);
  });
});
