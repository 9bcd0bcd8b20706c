// An Express request-timeout middleware (the usual `setTimeout(ms, () => { if (!res.headersSent)
// res.status(503).json(...) })`) in front of a guarded handler slower than it. Without the guard
// the client gets the 503 at the deadline and the late handler's answer is dropped. With it, the
// 503 must go out at the deadline too (the guard once held it until the handler settled, and on
// Redis then sent status 503 with the handler's body), and the handler must never run twice.
import { afterAll, beforeAll, describe, expect, it } from '@jest/globals';
import { Controller, HttpCode, Post } from '@nestjs/common';
import { randomUUID } from 'node:crypto';
import { Agent, type IncomingMessage, type ServerResponse } from 'node:http';
import { NoRepeatSubmit } from '../libs/idempotency/src/index.js';
import { makeApp, send, sleep, until, type EdgeApp } from './support/edge-app.js';

let runs = 0;
let finished = 0;
// The guarded handler works until the test has read the 503 (a fixed 2 s raced a loaded CI
// machine's answer); 20 s at most, so a guard that holds the 503 until the handler ends still
// fails the test (the request's own 5 s timeout).
let endWork: () => void = () => undefined;
const workGate = () => new Promise<void>((resolve) => {
  endWork = resolve;
  setTimeout(resolve, 20_000).unref();
});

@Controller('reports')
class ReportsController {
  @Post()
  @HttpCode(200)
  @NoRepeatSubmit()
  async create() {
    runs++;
    await workGate(); // past the 200 ms deadline
    finished++;
    return { report: runs };
  }

  @Post('unguarded')
  @HttpCode(200)
  async unguarded() {
    await sleep(2000);
    return { report: 0 };
  }
}

function requestTimeout(ms: number) {
  return (_req: IncomingMessage, res: ServerResponse & { status(code: number): { json(body: unknown): void } }, next: () => void) => {
    const timer = setTimeout(() => {
      if (!res.headersSent) res.status(503).json({ error: 'request timed out' });
    }, ms);
    res.on('finish', () => clearTimeout(timer));
    res.on('close', () => clearTimeout(timer));
    next();
  };
}

describe('an Express request-timeout middleware in front of a guarded handler', () => {
  let a: EdgeApp;
  beforeAll(async () => {
    a = await makeApp('express', [ReportsController], {}, { setup: (app) => void app.use(requestTimeout(200)) });
  });
  afterAll(async () => {
    endWork();
    await a?.close();
  });

  it('(control, no guard) answers 503 at the deadline', async () => {
    const answer = await send(a.url, '/reports/unguarded', { timeoutMs: 5000 });
    expect(answer.status).toBe(503);
    await sleep(2000);
  });

  it('answers 503 at the deadline, keeps the process up, and never runs the handler twice', async () => {
    const key = randomUUID();
    const agent = new Agent({ keepAlive: true, maxSockets: 1 }); // a browser or a proxy keeps the connection
    const first = await send(a.url, '/reports', { key, timeoutMs: 5000, agent });
    const handlerDone = finished;
    endWork();
    await until(() => finished === 1, 8000, 'the handler to finish');
    const retry = await send(a.url, '/reports', { key, timeoutMs: 5000, agent });
    agent.destroy();
    expect({ status: first.status, handlerDone }).toEqual({ status: 503, handlerDone: 0 });
    expect(retry.status).not.toBe(200 /* a second run */);
    expect(runs).toBe(1);
  });
});
