// An app-wide interceptor that retries a timed-out call (`timeout()` then `retry()`; a common
// "resilience" interceptor). The retry subscribes to the guard's Observable a second time in the
// same request. The guard once marked the request as handled on the first subscription and, on
// the second, returned `next.handle()` unguarded: the handler ran again while the first run
// (still owning the key) went on. Each subscription is now guarded on its own.
import { afterAll, beforeAll, describe, expect, it } from '@jest/globals';
import { Controller, HttpCode, Post, type CallHandler, type ExecutionContext, type NestInterceptor } from '@nestjs/common';
import { APP_INTERCEPTOR } from '@nestjs/core';
import { randomUUID } from 'node:crypto';
import { retry, timeout, type Observable } from 'rxjs';
import { NoRepeatSubmit } from '../libs/idempotency/src/index.js';
import { makeApp, send, sleep, type Adapter, type EdgeApp } from './support/edge-app.js';

class RetryOnTimeout implements NestInterceptor {
  intercept(_ctx: ExecutionContext, next: CallHandler): Observable<unknown> {
    return next.handle().pipe(timeout(150), retry(2));
  }
}

let flaky = 0;
let flakyFailures = 0;

let runs = 0;

@Controller('transfers')
class TransfersController {
  @Post()
  @HttpCode(200)
  @NoRepeatSubmit()
  async create() {
    runs++;
    await sleep(300);
    return { sent: true };
  }

  /** Fails once (a transient error), then succeeds: the outer retry's second attempt succeeds. */
  @Post('flaky')
  @HttpCode(200)
  @NoRepeatSubmit()
  flaky() {
    flaky++;
    if (flakyFailures++ === 0) throw new Error('transient');
    return { sent: flaky };
  }
}

describe.each<Adapter>(['express', 'fastify'])('an outer retry after a timeout (%s)', (adapter) => {
  let app: EdgeApp;
  beforeAll(async () => {
    app = await makeApp(adapter, [TransfersController], {}, { providers: [{ provide: APP_INTERCEPTOR, useClass: RetryOnTimeout }] });
  });
  afterAll(() => app.close());

  it('never runs the handler a second time for one request', async () => {
    runs = 0;
    const answer = await send(app.url, '/transfers', { key: randomUUID() });
    await sleep(800);
    // Observed: runs === 3 (each retry ran the handler unguarded) and the client got a 500/408.
    expect({ runs, status: answer.status }).toEqual({ runs: 1, status: expect.any(Number) });
  });

  it('saves the success of a retried attempt, so the client\'s retry is a replay', async () => {
    flaky = 0;
    flakyFailures = 0;
    const key = randomUUID();
    const first = await send(app.url, '/transfers/flaky', { key });
    const again = await send(app.url, '/transfers/flaky', { key });
    expect(first.status).toBe(200);
    // Observed: the retried attempt ran unguarded and was not saved: the client's retry ran it again.
    expect({ runs: flaky, again: again.text }).toEqual({ runs: 2, again: first.text });
  });
});
