// An app-wide interceptor that retries a timed-out call (`timeout()` then `retry()`; a common
// "resilience" interceptor). The retry subscribes to the guard's Observable a second time in the
// same request. The guard once marked the request as handled on the first subscription and, on
// the second, returned `next.handle()` unguarded: the handler ran again while the first run
// (still owning the key) went on. Each subscription is now guarded on its own.
import { afterAll, beforeAll, describe, expect, it } from '@jest/globals';
import { Controller, HttpCode, Post, type CallHandler, type ExecutionContext, type NestInterceptor } from '@nestjs/common';
import { APP_INTERCEPTOR } from '@nestjs/core';
import { randomUUID } from 'node:crypto';
import { defer, mergeMap, retry, timeout, type Observable } from 'rxjs';
import { NoRepeatSubmit } from '../libs/idempotency/src/index.js';
import { codeOf, makeApp, replayed, send, sleep, type Adapter, type EdgeApp } from './support/edge-app.js';

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

// A unit-of-work interceptor (one transaction per request, committed after the handler's value)
// that retries a failed COMMIT (a serialization failure, 40001). The guard counts the run as
// done when the method's value comes, so the retry's subscription found the key held by its own
// request: 409 in progress, and that refusal, the answer the client got, was saved and replayed
// to every retry of the key for its whole retention, while the transfer never committed (an
// adversarial helper, on Redis and PostgreSQL). The COMMIT is simulated: the guard sees only the
// Observable, and the failure must come after the handler's value, once.
let commitFailures = 0;
const committed: number[] = [];

class UnitOfWork implements NestInterceptor {
  intercept(_ctx: ExecutionContext, next: CallHandler): Observable<unknown> {
    return defer(() =>
      next.handle().pipe(
        mergeMap(async (value: { run: number }) => {
          if (commitFailures > 0) {
            commitFailures--;
            throw new Error('could not serialize access due to concurrent update');
          }
          committed.push(value.run);
          return value;
        }),
      ),
    ).pipe(retry(3));
  }
}

let transfers = 0;

@Controller('uow')
class UnitOfWorkController {
  @Post()
  @NoRepeatSubmit()
  async create() {
    await sleep(20);
    return { run: ++transfers };
  }
}

describe.each<Adapter>(['express', 'fastify'])('an outer unit of work that retries a failed COMMIT (%s)', (adapter) => {
  let app: EdgeApp;
  beforeAll(async () => {
    app = await makeApp(adapter, [UnitOfWorkController], {}, { providers: [{ provide: APP_INTERCEPTOR, useClass: UnitOfWork }] });
  });
  afterAll(() => app.close());

  it('runs the handler again in the same request, saves the committed run, and replays it to the client\'s retry', async () => {
    transfers = 0;
    committed.length = 0;
    commitFailures = 1;
    const key = randomUUID();
    const first = await send(app.url, '/uow', { key });
    // Observed before: 409 IDEMPOTENCY_IN_PROGRESS, nothing committed.
    expect({ status: first.status, body: first.text, committed, runs: transfers }).toEqual({
      status: 201,
      body: '{"run":2}',
      committed: [2],
      runs: 2,
    });
    // Observed before: the 409 again, as a replay.
    const again = await send(app.url, '/uow', { key });
    expect({ status: again.status, body: again.text, replayed: replayed(again), runs: transfers }).toEqual({
      status: 201,
      body: '{"run":2}',
      replayed: true,
      runs: 2,
    });
  });

  it('(control) a COMMIT that fails on every attempt: the last failure goes out, and a retry is told so, never a saved 409 in progress', async () => {
    transfers = 0;
    committed.length = 0;
    commitFailures = 4;
    const key = randomUUID();
    const first = await send(app.url, '/uow', { key });
    const again = await send(app.url, '/uow', { key });
    // A 5xx after the method succeeded is kept as not replayable (the effect may have happened;
    // the README's Caveats): 409 without Retry-After, never the in-progress refusal replayed.
    expect({ first: first.status, again: again.status, code: codeOf(again), retryAfter: again.headers['retry-after'], runs: transfers }).toEqual({
      first: 500,
      again: 409,
      code: 'IDEMPOTENCY_RESPONSE_NOT_REPLAYABLE',
      retryAfter: undefined,
      runs: 4,
    });
  });
});
