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

  /** Progress of a job: one event every 100 ms, for 5 s. */
  @Sse('progress')
  progress() {
    return interval(100).pipe(
      map((i) => ({ data: { percent: i * 2 } })),
      take(50),
    );
  }
}

/** What the client received within `ms`. */
function eventsWithin(url: string, ms: number): Promise<{ status: number; text: string }> {
  return new Promise((resolve) => {
    let text = '';
    let status = 0;
    const req = request(url, { headers: { accept: 'text/event-stream', 'idempotency-key': randomUUID() } }, (res) => {
      status = res.statusCode ?? 0;
      res.on('data', (chunk: Buffer) => (text += chunk.toString()));
    });
    req.on('error', () => undefined);
    req.end();
    setTimeout(() => {
      req.destroy();
      resolve({ status, text });
    }, ms);
  });
}

describe.each<Adapter>(['express', 'fastify'])('an @Sse route under a class-level guard (%s)', (adapter) => {
  let a: EdgeApp;
  beforeAll(async () => {
    a = await makeApp(adapter, [JobsController]);
  });
  afterAll(async () => a?.close());

  it('delivers events as they come (within 1 s of a 5 s stream)', async () => {
    const { status, text } = await eventsWithin(`${a.url}/jobs/progress`, 1000);
    expect(status).toBe(200);
    expect(text).toContain('data: {"percent":0}');
  });
});
