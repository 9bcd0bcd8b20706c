// A handler whose Observable emits a value and then fails (a merge of two calls, the second of
// which fails). Nest answers an Observable with its last value or its error, so the client gets
// the error: the key must be released (a retry runs again), never the error saved and replayed,
// never the key left "not replayable" for the whole retention. And the values must still go on
// as they come: an app's outer take(1) (a live feed) or timeout({ first }) sees the first at once.
import { afterAll, beforeAll, describe, expect, it } from '@jest/globals';
import { ConflictException, Controller, Injectable, Param, Post, UseInterceptors, type CallHandler, type NestInterceptor } from '@nestjs/common';
import { randomUUID } from 'node:crypto';
import { NEVER, concat, map, of, take, throwError, timeout, timer } from 'rxjs';
import { NoRepeatSubmit } from '../libs/idempotency/src/index.js';
import { makeApp, replayed, send, type Adapter, type EdgeApp } from './support/edge-app.js';

let runs = 0;

@Controller('late')
class ReservationsController {
  @Post('fails/:status')
  @NoRepeatSubmit()
  failLate(@Param('status') status: string) {
    runs++;
    const failure = status === '500' ? new Error('downstream failed') : new ConflictException(`stock gone (run ${runs})`);
    return concat(
      of({ reserved: true }),
      timer(20).pipe(
        map(() => {
          throw failure;
        }),
      ),
    );
  }

  @Post('fails-saved/:status')
  @NoRepeatSubmit({ saveStatuses: [409] })
  failLateSaved(@Param('status') status: string) {
    return this.failLate(status);
  }

  @Post('two-values')
  @NoRepeatSubmit()
  twoValues() {
    runs++;
    return concat(of({ step: 1 }), timer(20).pipe(map(() => ({ step: 2, run: runs }))));
  }
}

/** The app's own interceptors, outside the guard: the first value of a live feed, and a first-value deadline. */
@Injectable()
class FirstValue implements NestInterceptor {
  intercept(_ctx: unknown, next: CallHandler) {
    return next.handle().pipe(take(1));
  }
}

@Injectable()
class FirstValueWithin implements NestInterceptor {
  intercept(_ctx: unknown, next: CallHandler) {
    return next.handle().pipe(timeout({ first: 1000 }));
  }
}

@Controller('feeds')
class FeedsController {
  /** A live feed: one value now, and it never completes. */
  @Post('live')
  @UseInterceptors(FirstValue)
  @NoRepeatSubmit()
  live() {
    runs++;
    return concat(of({ price: 42, run: runs }), NEVER);
  }

  /** A value, then at once an error: the outer take(1) answers with the value. */
  @Post('glitch')
  @UseInterceptors(FirstValue)
  @NoRepeatSubmit()
  glitch() {
    runs++;
    return concat(of({ price: 43, run: runs }), throwError(() => new Error('feed lost')));
  }

  /** Accepted at once, done after 1.5 s: the first-value deadline (1 s) is met. */
  @Post('accepted')
  @UseInterceptors(FirstValueWithin)
  @NoRepeatSubmit()
  accepted() {
    runs++;
    return concat(of({ accepted: true }), timer(1500).pipe(map(() => ({ done: true, run: runs }))));
  }
}

describe.each<Adapter>(['express', 'fastify'])('a handler that emits a value, then fails (%s)', (adapter) => {
  let a: EdgeApp;
  beforeAll(async () => {
    a = await makeApp(adapter, [ReservationsController, FeedsController], { store: { redis: process.env.REDIS_URL ?? 'redis://127.0.0.1:6379' } });
  });
  afterAll(async () => a?.close());

  it.each(['409', '500'])('answers its error (%s) and releases the key: a retry runs the handler again', async (status) => {
    const key = randomUUID();
    const before = runs;
    const first = await send(a.url, `/late/fails/${status}`, { key });
    expect(first.status).toBe(Number(status));
    const retry = await send(a.url, `/late/fails/${status}`, { key });
    expect({ status: retry.status, replayed: replayed(retry), runs: runs - before }).toEqual({
      status: Number(status),
      replayed: false,
      runs: 2,
    });
  });

  it('answers a live feed\'s first value through an outer take(1), and replays it', async () => {
    const key = randomUUID();
    const first = await send(a.url, '/feeds/live', { key, timeoutMs: 3000 });
    expect({ status: first.status, error: first.error }).toEqual({ status: 201, error: undefined });
    const retry = await send(a.url, '/feeds/live', { key, timeoutMs: 3000 });
    expect({ replayed: replayed(retry), body: retry.text }).toEqual({ replayed: true, body: first.text });
  });

  it('keeps the first value an outer take(1) answered with, when the handler fails right after it', async () => {
    const key = randomUUID();
    const before = runs;
    const first = await send(a.url, '/feeds/glitch', { key });
    const retry = await send(a.url, '/feeds/glitch', { key });
    expect(first.status).toBe(201);
    expect({ replayed: replayed(retry), body: retry.text, runs: runs - before }).toEqual({ replayed: true, body: first.text, runs: 1 });
  });

  it('meets an outer timeout({ first }) with the first value, and saves the last', async () => {
    const key = randomUUID();
    const first = await send(a.url, '/feeds/accepted', { key, timeoutMs: 5000 });
    expect({ status: first.status, done: JSON.parse(first.text).done }).toEqual({ status: 201, done: true });
    const retry = await send(a.url, '/feeds/accepted', { key });
    expect({ replayed: replayed(retry), body: retry.text }).toEqual({ replayed: true, body: first.text });
  });

  it('saves the answer to a late 409 where the route saves that status (saveStatuses), and frees the key after a 500', async () => {
    const before = runs;
    const key = randomUUID();
    const first = await send(a.url, '/late/fails-saved/409', { key });
    const retry = await send(a.url, '/late/fails-saved/409', { key });
    expect({ status: retry.status, replayed: replayed(retry), body: retry.text, runs: runs - before }).toEqual({
      status: 409,
      replayed: true,
      body: first.text,
      runs: 1,
    });
    const other = randomUUID();
    await send(a.url, '/late/fails-saved/500', { key: other });
    const again = await send(a.url, '/late/fails-saved/500', { key: other });
    expect({ status: again.status, replayed: replayed(again), runs: runs - before }).toEqual({ status: 500, replayed: false, runs: 3 });
  });

  it('(control) saves the last value, the answer Nest sends, when the Observable completes', async () => {
    const key = randomUUID();
    const first = await send(a.url, '/late/two-values', { key });
    const retry = await send(a.url, '/late/two-values', { key });
    expect(first.status).toBe(201);
    expect(JSON.parse(first.text)).toMatchObject({ step: 2 });
    expect({ replayed: replayed(retry), body: retry.text }).toEqual({ replayed: true, body: first.text });
  });
});
