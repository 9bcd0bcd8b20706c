// An app-wide interceptor that retries a timed-out call (`timeout()` then `retry()`; a common
// "resilience" interceptor). The retry subscribes to the guard's Observable a second time in the
// same request. The guard once marked the request as handled on the first subscription and, on
// the second, returned `next.handle()` unguarded: the handler ran again while the first run
// (still owning the key) went on. Each subscription is now guarded on its own.
import { afterAll, beforeAll, beforeEach, describe, expect, it } from '@jest/globals';
import { Controller, HttpCode, Post, RequestTimeoutException, type CallHandler, type ExecutionContext, type NestInterceptor } from '@nestjs/common';
import { APP_INTERCEPTOR } from '@nestjs/core';
import { randomUUID } from 'node:crypto';
import { catchError, defer, mergeMap, retry, throwError, timeout, TimeoutError, type Observable } from 'rxjs';
import { NoRepeatSubmit } from '../libs/idempotency/src/index.js';
import { codeOf, makeApp, replayed, send, sleep, until, type Adapter, type EdgeApp } from './support/edge-app.js';

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
// outside the guard. The guard counts the run as done when the method's value comes; what
// happens outside it afterwards it cannot tell apart: a COMMIT that failed (nothing happened) and
// is retried, or an outer timeout's retry while the COMMIT still runs (it will happen). So the
// handler never runs twice for one request. Observed before: a retried COMMIT's subscription was
// refused 409 in progress by its own request's claim, and that refusal was saved and replayed for
// the key's retention (an adversarial helper); freeing the key instead (this session's first
// fix) ran a timeout's retry beside the COMMIT, 2-3 commits for one request (another). The COMMIT
// is simulated: the guard sees only the Observable.
let commitFailures = 0;
let commitMs = 0;
const committed: number[] = [];

const commit = (value: { run: number }) =>
  new Promise<{ run: number }>((resolve, reject) =>
    setTimeout(() => {
      if (commitFailures > 0) {
        commitFailures--;
        reject(new Error('could not serialize access due to concurrent update'));
      } else {
        committed.push(value.run);
        resolve(value);
      }
    }, commitMs),
  );

class UnitOfWork implements NestInterceptor {
  intercept(_ctx: ExecutionContext, next: CallHandler): Observable<unknown> {
    return defer(() => next.handle().pipe(mergeMap(commit))).pipe(retry(3));
  }
}

/** Nest's docs' timeout, with a retry, outside the unit of work. */
class TimeoutThenRetry implements NestInterceptor {
  intercept(_ctx: ExecutionContext, next: CallHandler): Observable<unknown> {
    return next.handle().pipe(
      timeout(150),
      retry(2),
      catchError((error: unknown) => throwError(() => (error instanceof TimeoutError ? new RequestTimeoutException() : error))),
    );
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

describe.each<Adapter>(['express', 'fastify'])('an outer unit of work (%s)', (adapter) => {
  let retrying: EdgeApp;
  let timed: EdgeApp;
  beforeAll(async () => {
    retrying = await makeApp(adapter, [UnitOfWorkController], {}, { providers: [{ provide: APP_INTERCEPTOR, useClass: UnitOfWork }] });
    timed = await makeApp(adapter, [UnitOfWorkController], {}, {
      providers: [
        { provide: APP_INTERCEPTOR, useClass: TimeoutThenRetry },
        { provide: APP_INTERCEPTOR, useClass: UnitOfWork },
      ],
    });
  });
  afterAll(async () => {
    await retrying?.close();
    await timed?.close();
  });
  beforeEach(() => {
    transfers = 0;
    committed.length = 0;
    commitFailures = 0;
    commitMs = 0;
  });

  it('a retried failed COMMIT: the handler ran once; the answer is the refusal, never saved: retries are told not to retry', async () => {
    commitFailures = 1;
    const key = randomUUID();
    const first = await send(retrying.url, '/uow', { key });
    const again = await send(retrying.url, '/uow', { key });
    // Observed before: the first 409 IDEMPOTENCY_IN_PROGRESS again, as a replay, for an hour.
    expect({
      first: [first.status, codeOf(first)],
      again: [again.status, codeOf(again), replayed(again), again.headers['retry-after']],
      runs: transfers,
      committed,
    }).toEqual({
      first: [409, 'IDEMPOTENCY_IN_PROGRESS'],
      again: [409, 'IDEMPOTENCY_RESPONSE_NOT_REPLAYABLE', false, undefined],
      runs: 1,
      committed: [],
    });
  });

  it("a timeout's retry while the COMMIT still runs never runs the handler again: one commit", async () => {
    commitMs = 300;
    const key = randomUUID();
    const first = await send(timed.url, '/uow', { key });
    await until(() => committed.length > 0, 3000, 'the COMMIT');
    await sleep(100);
    const again = await send(timed.url, '/uow', { key });
    // Observed with the key freed for the retry: 3 runs, 3 commits.
    expect({ first: first.status, again: [again.status, codeOf(again), replayed(again)], runs: transfers, committed }).toEqual({
      first: 409,
      again: [409, 'IDEMPOTENCY_RESPONSE_NOT_REPLAYABLE', false],
      runs: 1,
      committed: [1],
    });
  });
});

// The same timeout without a retry: its 408 comes after the method's value, while the COMMIT
// runs. It was saved as the request's answer and replayed to every retry (an adversarial
// helper): a client that retries on 408 looped until the key's retention ended.
class TimeoutOnly implements NestInterceptor {
  intercept(_ctx: ExecutionContext, next: CallHandler): Observable<unknown> {
    return next.handle().pipe(
      timeout(150),
      catchError((error: unknown) => throwError(() => (error instanceof TimeoutError ? new RequestTimeoutException() : error))),
    );
  }
}

describe.each<Adapter>(['express', 'fastify'])("an outer timeout's 408 after the method's value (%s)", (adapter) => {
  let app: EdgeApp;
  beforeAll(async () => {
    app = await makeApp(adapter, [UnitOfWorkController], {}, {
      providers: [
        { provide: APP_INTERCEPTOR, useClass: TimeoutOnly },
        { provide: APP_INTERCEPTOR, useClass: UnitOfWork },
      ],
    });
  });
  afterAll(() => app?.close());

  it('is never replayed: retries get 409 IDEMPOTENCY_RESPONSE_NOT_REPLAYABLE, the handler ran once', async () => {
    transfers = 0;
    committed.length = 0;
    commitFailures = 0;
    commitMs = 300;
    const key = randomUUID();
    const first = await send(app.url, '/uow', { key });
    await until(() => committed.length > 0, 3000, 'the COMMIT');
    const again = await send(app.url, '/uow', { key });
    expect({ first: first.status, again: [again.status, codeOf(again), replayed(again)], runs: transfers }).toEqual({
      first: 408,
      again: [409, 'IDEMPOTENCY_RESPONSE_NOT_REPLAYABLE', false],
      runs: 1,
    });
  });
});
