// A handler that waits for each write's callback before the next write (promisified
// writes, Writable.toWeb(res), pipeline helpers). Held writes must not hold their callbacks, or
// the handler never ends, the client hangs, and the key frees only when the lease ends.
import { afterAll, beforeAll, describe, expect, it } from '@jest/globals';
import { Controller, Headers, Post, Res } from '@nestjs/common';
import { randomUUID } from 'node:crypto';
import type { ServerResponse } from 'node:http';
import { NoRepeatSubmit } from '../libs/idempotency/src/index.js';
import { makeApp, replayed, send, type Adapter, type EdgeApp } from './support/edge-app.js';

const write = (res: ServerResponse, chunk: string) =>
  new Promise<void>((resolve, reject) => res.write(chunk, (error) => (error ? reject(error) : resolve())));

@Controller('x')
class StreamingController {
  @Post('report')
  @NoRepeatSubmit()
  report(@Res() res: ServerResponse & { raw?: ServerResponse; hijack?: () => void }) {
    return this.unguarded(res);
  }

  /** The same handler without the guard: the control, which passes. */
  @Post('unguarded')
  async unguarded(@Res() res: ServerResponse & { raw?: ServerResponse; hijack?: () => void }) {
    const raw = res.raw ?? res;
    res.hijack?.(); // Fastify: the handler owns reply.raw
    raw.writeHead(200, { 'content-type': 'text/plain' });
    for (const line of ['a\n', 'b\n', 'c\n']) await write(raw, line);
    raw.end('done\n');
  }
}

@Controller('y')
class AwaitEndController {
  /** Ends the answer, waits until it is flushed, then cleans up: `await finished`-style code. */
  @Post('receipt')
  @NoRepeatSubmit()
  async receipt(@Res() res: ServerResponse & { raw?: ServerResponse; hijack?: () => void }) {
    const raw = res.raw ?? res;
    res.hijack?.();
    raw.writeHead(200, { 'content-type': 'text/plain' });
    await new Promise<void>((resolve) => raw.end('receipt\n', () => resolve()));
  }
}

const runs = new Map<string, number>();

@Controller('z')
class FlushingController {
  /**
   * Hand-written SSE: the head set, a first event written, then flushHeaders() (a no-op in Node
   * once the head went out). The guard held the head, so Node's flushHeaders() sent it through
   * writeHead(statusCode), which the capture refused: ERR_HTTP_HEADERS_SENT cut the answer after
   * its first event, released the key, and every retry ran again (an adversarial helper: 20 of
   * 20 keys, both adapters).
   */
  @Post('events')
  @NoRepeatSubmit()
  events(@Res() res: ServerResponse & { raw?: ServerResponse; hijack?: () => void }, @Headers('idempotency-key') key: string) {
    runs.set(key, (runs.get(key) ?? 0) + 1);
    const raw = res.raw ?? res;
    res.hijack?.();
    raw.setHeader('content-type', 'text/event-stream');
    raw.write('data: one\n\n');
    raw.flushHeaders();
    raw.end('data: two\n\n');
  }
}

describe.each<Adapter>(['express', 'fastify'])('a handler calling flushHeaders() after its first write (%s)', (adapter) => {
  let a: EdgeApp;
  beforeAll(async () => {
    a = await makeApp(adapter, [FlushingController]);
  });
  afterAll(async () => a?.close());

  it('sends its whole answer, runs once, and its answer replays', async () => {
    const key = randomUUID();
    const first = await send(a.url, '/z/events', { key, timeoutMs: 2000 });
    expect({ status: first.status, body: first.text, error: first.error }).toEqual({ status: 201, body: 'data: one\n\ndata: two\n\n', error: undefined });
    const second = await send(a.url, '/z/events', { key, timeoutMs: 2000 });
    expect({ status: second.status, body: second.text, replayed: replayed(second), runs: runs.get(key) }).toEqual({
      status: 201,
      body: 'data: one\n\ndata: two\n\n',
      replayed: true,
      runs: 1,
    });
  });
});

describe.each<Adapter>(['express', 'fastify'])('a handler awaiting its end() callback (%s)', (adapter) => {
  let a: EdgeApp;
  beforeAll(async () => {
    a = await makeApp(adapter, [AwaitEndController]);
  });
  afterAll(async () => a?.close());

  it('finishes', async () => {
    const first = await send(a.url, '/y/receipt', { key: randomUUID(), timeoutMs: 2000 });
    expect({ status: first.status, body: first.text, error: first.error }).toEqual({ status: 200, body: 'receipt\n', error: undefined });
  });
});

describe.each<Adapter>(['express', 'fastify'])('a handler awaiting its write callbacks (%s)', (adapter) => {
  let a: EdgeApp;
  beforeAll(async () => {
    a = await makeApp(adapter, [StreamingController]);
  });
  afterAll(async () => a?.close());

  it('(control, no guard) finishes', async () => {
    const first = await send(a.url, '/x/unguarded', { timeoutMs: 2000 });
    expect({ status: first.status, body: first.text, error: first.error }).toEqual({ status: 200, body: 'a\nb\nc\ndone\n', error: undefined });
  });

  it('finishes, and its answer replays', async () => {
    const key = randomUUID();
    const first = await send(a.url, '/x/report', { key, timeoutMs: 2000 });
    expect({ status: first.status, body: first.text, error: first.error }).toEqual({ status: 200, body: 'a\nb\nc\ndone\n', error: undefined });
    const second = await send(a.url, '/x/report', { key, timeoutMs: 2000 });
    expect({ status: second.status, body: second.text, replayed: replayed(second) }).toEqual({ status: 200, body: 'a\nb\nc\ndone\n', replayed: true });
  });
});
