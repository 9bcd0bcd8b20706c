// The claim resolves after an outer interceptor already answered (Nest docs'
// TimeoutInterceptor on a controller, a store that is slow for a moment). Nobody subscribes to
// the Observable the guard returns, so the handler never runs, yet the key stays claimed: every
// retry gets 409 IDEMPOTENCY_IN_PROGRESS for the whole lease (30 s by default) for an operation
// that never started. The same happens to a waiting duplicate (waitForResultMs) that acquires
// after its client timed out, and to a fail-open run whose late claim lands.
import { afterAll, beforeAll, describe, expect, it } from '@jest/globals';
import {
  Controller,
  HttpCode,
  Post,
  RequestTimeoutException,
  UseInterceptors,
  type CallHandler,
  type ExecutionContext,
  type NestInterceptor,
} from '@nestjs/common';
import { randomUUID } from 'node:crypto';
import { TimeoutError, catchError, throwError, timeout, type Observable } from 'rxjs';
import { MemoryIdempotencyStore, NoRepeatSubmit } from '../libs/idempotency/src/index.js';
import type { ClaimInput, ClaimResult } from '../libs/idempotency/src/stores/idempotency-store.js';
import { codeOf, makeApp, send, sleep, type Adapter, type EdgeApp } from './support/edge-app.js';

/** The memory store, with claims slowed down on demand (a store that stalls for a moment). */
class StallingStore extends MemoryIdempotencyStore {
  claimDelayMs = 0;
  override async claim(input: ClaimInput): Promise<ClaimResult> {
    await sleep(this.claimDelayMs);
    return super.claim(input);
  }
}

class TimeoutInterceptor implements NestInterceptor {
  intercept(_ctx: ExecutionContext, next: CallHandler): Observable<unknown> {
    return next.handle().pipe(
      timeout(200),
      catchError((error) => throwError(() => (error instanceof TimeoutError ? new RequestTimeoutException() : error))),
    );
  }
}

let runs = 0;

@Controller('orders')
@UseInterceptors(TimeoutInterceptor)
class OrdersController {
  @Post()
  @HttpCode(200)
  @NoRepeatSubmit({ leaseSeconds: 5 })
  create() {
    runs++;
    return { run: runs };
  }
}

describe.each<Adapter>(['express', 'fastify'])('a claim that lands after the outer timeout (%s)', (adapter) => {
  let a: EdgeApp;
  const store = new StallingStore();
  beforeAll(async () => {
    a = await makeApp(adapter, [OrdersController], { store });
  });
  afterAll(async () => a?.close());

  it('does not strand the key: the retry runs the handler (it never ran)', async () => {
    runs = 0;
    const key = randomUUID();
    store.claimDelayMs = 400;
    const first = await send(a.url, '/orders', { key }); // 408 at 200 ms; the claim lands at 400 ms
    await sleep(400);
    store.claimDelayMs = 0;
    const retry = await send(a.url, '/orders', { key });
    expect(first.status).toBe(408);
    expect({ retry: retry.status === 409 ? codeOf(retry) : retry.status, runs }).toEqual({ retry: 200, runs: 1 });
  });
});
