// A handler whose Observable emits a value and then fails (a merge of two calls, the second of
// which fails). Nest answers an Observable with its last value or its error, so the client gets
// the error: the key must be released (a retry runs again), never the error saved and replayed,
// never the key left "not replayable" for the whole retention.
import { afterAll, beforeAll, describe, expect, it } from '@jest/globals';
import { ConflictException, Controller, Param, Post } from '@nestjs/common';
import { randomUUID } from 'node:crypto';
import { concat, map, of, timer } from 'rxjs';
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

  @Post('two-values')
  @NoRepeatSubmit()
  twoValues() {
    runs++;
    return concat(of({ step: 1 }), timer(20).pipe(map(() => ({ step: 2, run: runs }))));
  }
}

describe.each<Adapter>(['express', 'fastify'])('a handler that emits a value, then fails (%s)', (adapter) => {
  let a: EdgeApp;
  beforeAll(async () => {
    a = await makeApp(adapter, [ReservationsController], { store: { redis: process.env.REDIS_URL ?? 'redis://127.0.0.1:6379' } });
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

  it('(control) saves the last value, the answer Nest sends, when the Observable completes', async () => {
    const key = randomUUID();
    const first = await send(a.url, '/late/two-values', { key });
    const retry = await send(a.url, '/late/two-values', { key });
    expect(first.status).toBe(201);
    expect(JSON.parse(first.text)).toMatchObject({ step: 2 });
    expect({ replayed: replayed(retry), body: retry.text }).toEqual({ replayed: true, body: first.text });
  });
});
