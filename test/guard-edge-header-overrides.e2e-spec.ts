// An APM-style agent on the response: it wraps writeHead to add its trace header to the head, and
// answers getHeader / hasHeader for it, without Node holding it where getHeaderNames() lists it
// (Fastify passes its head to writeHead, and Node writes such a head without keeping it). The
// capture and the replay read headers through the response's own methods where an agent replaced
// them (helper-221: reading only the names getHeaderNames() lists, a saved header went missing
// from every replay, and a Vary the agent reported went missing from it too).
import { afterAll, beforeAll, describe, expect, it } from '@jest/globals';
import { Controller, Post } from '@nestjs/common';
import type { ServerResponse } from 'node:http';
import { randomUUID } from 'node:crypto';
import { NoRepeatSubmit } from '../libs/idempotency/src/index.js';
import { makeApp, replayed, send, type Adapter, type EdgeApp } from './support/edge-app.js';

let runs = 0;

@Controller('orders')
class OrdersController {
  @Post()
  @NoRepeatSubmit()
  create() {
    runs++;
    return { order: runs };
  }
}

/**
 * The agent: its header on every head that has none (a replay's saved one stays), and reported by
 * getHeader and hasHeader, whatever Node holds.
 */
function traceEvery(res: ServerResponse, trace: string): void {
  const { writeHead, getHeader, hasHeader } = res;
  res.writeHead = function (this: ServerResponse, status: number, ...rest: unknown[]) {
    const head = rest.find((arg) => typeof arg === 'object' && arg !== null && !Array.isArray(arg)) as Record<string, unknown> | undefined;
    if (getHeader.call(this, 'x-trace') !== undefined) return (writeHead as (...a: unknown[]) => ServerResponse).call(this, status, ...rest);
    // A head of its own: the one it was handed stays as it was.
    if (head) rest = rest.map((arg) => (arg === head ? { ...head, 'X-Trace': trace } : arg));
    else this.setHeader('X-Trace', trace);
    return (writeHead as (...a: unknown[]) => ServerResponse).call(this, status, ...rest);
  } as ServerResponse['writeHead'];
  res.getHeader = function (this: ServerResponse, name: string) {
    return name.toLowerCase() === 'x-trace' ? trace : getHeader.call(this, name);
  };
  res.hasHeader = function (this: ServerResponse, name: string) {
    return name.toLowerCase() === 'x-trace' || hasHeader.call(this, name);
  };
}

describe.each<Adapter>(['express', 'fastify'])('an agent that overrides the response header methods (%s)', (adapter) => {
  let a: EdgeApp;
  let traces = 0;
  beforeAll(async () => {
    a = await makeApp(adapter, [OrdersController], { replayHeaders: ['content-type', 'x-trace'] }, {
      setup: (app) => {
        const trace = (res: ServerResponse) => traceEvery(res, `t${++traces}`);
        if (adapter === 'fastify') {
          const fastify = app.getHttpAdapter().getInstance() as {
            addHook(name: 'onRequest', hook: (req: unknown, reply: { raw: ServerResponse }, done: () => void) => void): void;
          };
          fastify.addHook('onRequest', (_req, reply, done) => {
            trace(reply.raw);
            done();
          });
        } else {
          app.use((_req: unknown, res: ServerResponse, next: () => void) => {
            trace(res);
            next();
          });
        }
      },
    });
  });
  afterAll(async () => a?.close());

  it('replays the trace header the first answer went out with', async () => {
    const key = randomUUID();
    const first = await send(a.url, '/orders', { key, body: { n: 1 } });
    const replay = await send(a.url, '/orders', { key, body: { n: 1 } });
    expect(first.status).toBe(201);
    expect(replayed(replay)).toBe(true);
    expect(replay.text).toBe(first.text);
    expect(replay.headers['x-trace']).toBe(first.headers['x-trace']);
  });
});
