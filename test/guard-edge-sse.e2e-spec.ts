// A class-level @NoRepeatSubmit on a controller that also has an @Sse route. Server-sent
// events must reach the client as they are emitted, not when the stream ends.
import { afterAll, beforeAll, describe, expect, it } from '@jest/globals';
import { Controller, Post, Sse } from '@nestjs/common';
import { randomUUID } from 'node:crypto';
import { request } from 'node:http';
import { interval, map, take } from 'rxjs';
import { NoRepeatSubmit } from '../libs/idempotency/src/index.js';
import { makeApp, type Adapter, type EdgeApp } from './support/edge-app.js';

@Controller('jobs')
@NoRepeatSubmit()
class JobsController {
  @Post()
  start() {
    return { started: true };
  }

  /** Progress of a job: one event every 100 ms, for 10 s. */
  @Sse('progress')
  progress() {
    return interval(100).pipe(
      map((i) => ({ data: { percent: i } })),
      take(100),
    );
  }
}

/** What the client received once `expected` arrived, or when `ms` passed without it. */
function eventsUntil(url: string, expected: string, ms: number): Promise<{ status: number; text: string }> {
  return new Promise((resolve) => {
    let text = '';
    let status = 0;
    const req = request(url, { headers: { accept: 'text/event-stream', 'idempotency-key': randomUUID() } }, (res) => {
      status = res.statusCode ?? 0;
      res.on('data', (chunk: Buffer) => {
        text += chunk.toString();
        if (text.includes(expected)) done();
      });
    });
    const timer = setTimeout(() => done(), ms);
    function done() {
      clearTimeout(timer);
      req.destroy();
      resolve({ status, text });
    }
    req.on('error', () => undefined);
    req.end();
  });
}

describe.each<Adapter>(['express', 'fastify'])('an @Sse route under a class-level guard (%s)', (adapter) => {
  let a: EdgeApp;
  beforeAll(async () => {
    a = await makeApp(adapter, [JobsController]);
  });
  afterAll(async () => a?.close());

  // Held until the stream ends, the first event would come after 10 s; as it comes, after
  // 100 ms. The 4 s leaves room for a loaded machine (CI) and none for a held stream.
  it('delivers events as they come (the first within 4 s of a 10 s stream)', async () => {
    const { status, text } = await eventsUntil(`${a.url}/jobs/progress`, 'data: {"percent":0}', 4000);
    expect(status).toBe(200);
    expect(text).toContain('data: {"percent":0}');
    expect(text).not.toContain('data: {"percent":99}');
  });
});
