// A handler that ends its response twice (`res.json(x); res.end()`), harmless without the guard
// (Node ignores an end() without a chunk after the first), must not crash the process nor cut the
// first answer short. The guard once let the second end() out while it held the first: on the
// memory store the held end() then threw "write after end" as an unhandled 'error' event and the
// process exited; on Redis the client got res.json's Content-Length and no body.
import { afterAll, beforeAll, describe, expect, it } from '@jest/globals';
import { Controller, Post, Res } from '@nestjs/common';
import { randomUUID } from 'node:crypto';
import type { ServerResponse } from 'node:http';
import { NoRepeatSubmit } from '../libs/idempotency/src/index.js';
import { REDIS_URL } from './support/services.js';
import { makeApp, replayed, send, sleep, type Adapter, type EdgeApp } from './support/edge-app.js';

let runs = 0;

type AnyRes = ServerResponse & { json?(v: unknown): void; send?(v: unknown): void; raw?: ServerResponse };

@Controller('x')
class DoubleEndController {
  @Post('pay')
  @NoRepeatSubmit()
  pay(@Res() res: AnyRes) {
    this.unguarded(res);
  }

  /** The same handler without the guard: the control, which passes. */
  @Post('unguarded')
  unguarded(@Res() res: AnyRes) {
    runs++;
    if (res.raw) {
      res.send!({ paid: true, run: runs }); // Fastify reply
      res.raw.end();
    } else {
      res.json!({ paid: true, run: runs }); // Express
      res.end();
    }
  }
}

const CASES: [Adapter, 'memory' | 'redis'][] = [
  ['express', 'memory'],
  ['express', 'redis'],
  ['fastify', 'memory'],
  ['fastify', 'redis'],
];

describe.each(CASES)('a handler that ends its response twice (%s, %s store)', (adapter, store) => {
  let a: EdgeApp;
  beforeAll(async () => {
    const options = store === 'redis' ? { store: { redis: REDIS_URL }, keyPrefix: `double-end-${randomUUID()}` } : {};
    a = await makeApp(adapter, [DoubleEndController], options);
  });
  afterAll(async () => a?.close());

  it('(control, no guard) answers the first end() whole', async () => {
    const first = await send(a.url, '/x/unguarded', { timeoutMs: 2000 });
    await sleep(100);
    expect({ status: first.status, body: first.text, error: first.error }).toEqual({
      status: 201,
      body: expect.stringMatching(/^\{"paid":true,"run":\d+\}$/),
      error: undefined,
    });
  });

  it('answers the first end() whole, replays it, and keeps the process up', async () => {
    const key = randomUUID();
    const first = await send(a.url, '/x/pay', { key, timeoutMs: 2000 });
    await sleep(100); // the deferred end runs here: "write after end" was an unhandled 'error' event
    const second = await send(a.url, '/x/pay', { key, timeoutMs: 2000 });
    expect({ status: first.status, body: first.text, error: first.error }).toEqual({
      status: 201,
      body: expect.stringMatching(/^\{"paid":true,"run":\d+\}$/),
      error: undefined,
    });
    expect({ status: second.status, body: second.text, replayed: replayed(second) }).toEqual({
      status: 201,
      body: first.text,
      replayed: true,
    });
  });
});
