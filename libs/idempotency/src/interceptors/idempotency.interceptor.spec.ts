import { afterAll, beforeAll, describe, expect, it } from '@jest/globals';
import { Controller, Module, Post, type INestApplication } from '@nestjs/common';
import { NestFactory } from '@nestjs/core';
import { ExecutionContextHost } from '@nestjs/core/helpers/execution-context-host.js';
import { ExpressAdapter } from '@nestjs/platform-express';
import { EMPTY, NEVER, Observable, concat, lastValueFrom, of, throwError, toArray } from 'rxjs';
import { NoRepeatSubmit } from '../decorators/no-repeat-submit.decorator.js';
import { IdempotencyModule } from '../idempotency.module.js';
import { buildStorageKey } from '../keys/storage-key.js';
import type { SavedResponse } from '../stores/idempotency-store.js';
import { MemoryIdempotencyStore } from '../stores/memory/memory-idempotency.store.js';
import { IdempotencyInterceptor } from './idempotency.interceptor.js';

@Controller()
class OrdersController {
  @Post('orders')
  @NoRepeatSubmit()
  create() {
    return undefined; // never called: each test hands the interceptor its own handler Observable
  }
}

/** The memory store, with a save that takes a few milliseconds as a network store's does. */
class SlowSavingStore extends MemoryIdempotencyStore {
  override async complete(key: string, token: string, response: SavedResponse, ttlMs: number): Promise<boolean> {
    await new Promise((resolve) => setTimeout(resolve, 5));
    return super.complete(key, token, response, ttlMs);
  }
}

/**
 * How the guard runs a handler it owns the key for (`runOwned`), on the interceptor itself with
 * the memory store: the handler here is an Observable each test shapes (values, errors,
 * completion without a value, an unsubscribing client), which an HTTP test cannot all produce.
 */
describe('IdempotencyInterceptor: a handler it owns the key for', () => {
  const store = new SlowSavingStore();
  let app: INestApplication;
  let interceptor: IdempotencyInterceptor;
  let n = 0;

  beforeAll(async () => {
    @Module({ imports: [IdempotencyModule.forRoot({ store })], controllers: [OrdersController] })
    class AppModule {}
    app = await NestFactory.create(AppModule, new ExpressAdapter(), { logger: false });
    await app.init();
    interceptor = app.get(IdempotencyInterceptor);
  });
  afterAll(async () => {
    await app.close();
  });

  /** A fresh request with its own key; `stored()` reads its record. */
  function request() {
    const clientKey = `k-${++n}`;
    const req = { method: 'POST', url: '/orders', ip: '127.0.0.1', headers: { 'idempotency-key': clientKey }, body: { a: n } };
    const res = { statusCode: 201, getHeader: () => undefined, setHeader: () => undefined, set: () => undefined };
    const ctx = new ExecutionContextHost([req, res, () => undefined], OrdersController, OrdersController.prototype.create);
    const key = buildStorageKey({ prefix: 'no_repeat', user: { ip: '127.0.0.1' }, handler: 'OrdersController.create', key: clientKey });
    return { ctx, stored: () => store.get(key) };
  }
  const run = async (ctx: ExecutionContextHost, handler: Observable<unknown>) =>
    interceptor.intercept(ctx, { handle: () => handler });

  it('saves the first value before sending it on, and sends later values after it in order', async () => {
    const { ctx, stored } = request();
    const values = await lastValueFrom((await run(ctx, of({ id: 1 }, { id: 2 }))).pipe(toArray()));
    expect(values).toEqual([{ id: 1 }, { id: 2 }]);
    expect(await stored()).toMatchObject({ state: 'completed', response: { statusCode: 201, body: '{"id":1}' } });
  });

  it('has the response saved by the time the caller receives it', async () => {
    const { ctx, stored } = request();
    const observed = await new Promise((resolve) => {
      void run(ctx, of({ id: 1 })).then((result) => result.subscribe({ next: () => resolve(stored()) }));
    });
    expect(observed).toMatchObject({ state: 'completed' });
  });

  it('releases the key when the handler fails, and passes the error on', async () => {
    const { ctx, stored } = request();
    const failure = new Error('planned');
    await expect(lastValueFrom(await run(ctx, throwError(() => failure)))).rejects.toBe(failure);
    expect(await stored()).toBeUndefined();
  });

  it('releases the key when the handler completes without a value', async () => {
    const { ctx, stored } = request();
    await expect(lastValueFrom(await run(ctx, EMPTY), { defaultValue: 'none' })).resolves.toBe('none');
    expect(await stored()).toBeUndefined();
  });

  it('releases the key when the caller goes away before the handler answers', async () => {
    const { ctx, stored } = request();
    const subscription = (await run(ctx, NEVER)).subscribe();
    expect(await stored()).toMatchObject({ state: 'processing' });
    subscription.unsubscribe();
    await new Promise((resolve) => setImmediate(resolve));
    expect(await stored()).toBeUndefined();
  });

  it('keeps a saved response when the handler fails after its first value', async () => {
    const { ctx, stored } = request();
    const failure = new Error('late');
    const result = lastValueFrom((await run(ctx, concat(of({ id: 1 }), throwError(() => failure)))).pipe(toArray()));
    await expect(result).rejects.toBe(failure);
    expect(await stored()).toMatchObject({ state: 'completed', response: { body: '{"id":1}' } });
  });
});
