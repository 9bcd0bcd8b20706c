// Interceptors that Nest runs INSIDE the guard (closer to the handler): every
// method-level interceptor under a class-level @NoRepeatSubmit, and a method-level
// @UseInterceptors written above @NoRepeatSubmit (decorators apply bottom-up, so it lands after
// the guard in the list). Nest docs' TimeoutInterceptor there answers 408 while the handler keeps
// running; an interceptor that throws on the handler's value fails after the effect happened.
// The guard sees an error, releases the key, and the retry runs the handler again.
import { afterAll, beforeAll, beforeEach, describe, expect, it } from '@jest/globals';
import {
  BadRequestException,
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
import { TimeoutError, catchError, map, throwError, timeout, type Observable } from 'rxjs';
import { NoRepeatSubmit } from '../libs/idempotency/src/index.js';
import { codeOf, makeApp, send, sleep, until, type Adapter, type EdgeApp } from './support/edge-app.js';

/** Nest docs' TimeoutInterceptor, 200 ms. */
class TimeoutInterceptor implements NestInterceptor {
  intercept(_ctx: ExecutionContext, next: CallHandler): Observable<unknown> {
    return next.handle().pipe(
      timeout(200),
      catchError((error) => throwError(() => (error instanceof TimeoutError ? new RequestTimeoutException() : error))),
    );
  }
}

/** Validates the handler's result after the fact (the effect already happened). */
class RejectResultInterceptor implements NestInterceptor {
  intercept(_ctx: ExecutionContext, next: CallHandler): Observable<unknown> {
    return next.handle().pipe(
      map(() => {
        throw new BadRequestException('result failed validation');
      }),
    );
  }
}

const effects: Record<string, number> = {};
const effect = (name: string) => (effects[name] = (effects[name] ?? 0) + 1);

@Controller('payments')
@NoRepeatSubmit()
class ClassGuardedController {
  @Post('slow')
  @HttpCode(200)
  @UseInterceptors(TimeoutInterceptor)
  async slow() {
    await sleep(2000); // long past the 200 ms timeout, so the retry meets it running on a loaded machine
    effect('classSlow'); // the payment is made after the client got its 408
    return { paid: true };
  }
}

@Controller('transfers')
class MethodGuardedController {
  @Post('slow')
  @HttpCode(200)
  @UseInterceptors(TimeoutInterceptor) // written above: runs inside the guard
  @NoRepeatSubmit()
  async slow() {
    await sleep(2000); // long past the 200 ms timeout, so the retry meets it running on a loaded machine
    effect('methodSlow');
    return { sent: true };
  }

  @Post('checked')
  @HttpCode(200)
  @UseInterceptors(RejectResultInterceptor)
  @NoRepeatSubmit()
  checked() {
    effect('checked');
    return { sent: true };
  }
}

describe.each<Adapter>(['express', 'fastify'])('interceptors inside the guard (%s)', (adapter) => {
  let a: EdgeApp;
  beforeAll(async () => {
    a = await makeApp(adapter, [ClassGuardedController, MethodGuardedController]);
  });
  afterAll(async () => a?.close());
  beforeEach(() => Object.keys(effects).forEach((name) => delete effects[name]));

  it.each([
    ['class-level guard, method-level timeout', '/payments/slow', 'classSlow'],
    ['@UseInterceptors(Timeout) above @NoRepeatSubmit()', '/transfers/slow', 'methodSlow'],
  ])('%s: one effect per key across a 408 and its retries', async (_name, path, name) => {
    const key = randomUUID();
    const first = await send(a.url, path, { key }); // 408 after 200 ms; the handler runs on
    const retry = await send(a.url, path, { key }); // while the first still runs
    await until(() => (effects[name] ?? 0) >= 1, 8000, 'the first run finishing');
    await sleep(700);
    const later = await send(a.url, path, { key });
    await sleep(700);
    expect(first.status).toBe(408);
    expect({ retry: retry.status === 409 ? codeOf(retry) : retry.status, effects: effects[name] }).toEqual({
      retry: 'IDEMPOTENCY_IN_PROGRESS',
      effects: 1,
    });
    expect(later.status === 409 || later.headers['idempotent-replayed'] === 'true').toBe(true);
  });

  it('an inner interceptor failing on the result: one effect per key', async () => {
    const key = randomUUID();
    await send(a.url, '/transfers/checked', { key });
    await send(a.url, '/transfers/checked', { key });
    expect(effects.checked).toBe(1);
  });
});
