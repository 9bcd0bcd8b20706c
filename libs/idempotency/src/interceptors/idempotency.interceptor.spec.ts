import { afterAll, beforeAll, describe, expect, it, jest } from '@jest/globals';
import { Controller, Logger, Module, Post, type INestApplication, type Type } from '@nestjs/common';
import { MessagePattern } from '@nestjs/microservices';
import { NestFactory } from '@nestjs/core';
import { ExecutionContextHost } from '@nestjs/core/helpers/execution-context-host.js';
import { ExpressAdapter } from '@nestjs/platform-express';
import { lastValueFrom, of } from 'rxjs';
import { NoRepeatSubmit } from '../decorators/no-repeat-submit.decorator.js';
import { IdempotencyModule } from '../idempotency.module.js';
import { MemoryIdempotencyStore } from '../stores/memory/memory-idempotency.store.js';
import { IdempotencyInterceptor } from './idempotency.interceptor.js';

/** An app of `controller` with the guard on the memory store, and its interceptor to call directly. */
async function guardedApp(controller: Type): Promise<{ app: INestApplication; interceptor: IdempotencyInterceptor }> {
  @Module({ imports: [IdempotencyModule.forRoot({ store: new MemoryIdempotencyStore() })], controllers: [controller] })
  class AppModule {}
  const app = await NestFactory.create(AppModule, new ExpressAdapter(), { logger: false });
  await app.init();
  return { app, interceptor: app.get(IdempotencyInterceptor) };
}

@Controller()
class ResolversController {
  @Post('orders')
  @NoRepeatSubmit()
  create() {
    return undefined; // never called: the test hands the interceptor its own handler
  }
}

/**
 * Calls of a transport the guard does not know (GraphQL, WebSockets) run unguarded: that is said
 * once per handler, not silently. No HTTP test can produce such a context, hence the interceptor
 * called directly with one.
 */
describe('IdempotencyInterceptor on a GraphQL or WebSocket call', () => {
  let app: INestApplication;
  let interceptor: IdempotencyInterceptor;

  beforeAll(async () => {
    ({ app, interceptor } = await guardedApp(ResolversController));
  });
  afterAll(async () => app.close());

  it('runs the handler unguarded and warns once per handler', async () => {
    const warn = jest.spyOn(Logger.prototype, 'warn').mockImplementation(() => undefined);
    try {
      const call = () => {
        const ctx = new ExecutionContextHost([{}, {}, {}], ResolversController, ResolversController.prototype.create);
        ctx.setType('graphql');
        return lastValueFrom(interceptor.intercept(ctx, { handle: () => of('ran') }));
      };
      expect([await call(), await call()]).toEqual(['ran', 'ran']);
      const warnings = warn.mock.calls.filter(([message]) => String(message).includes('runs unguarded'));
      expect(warnings).toHaveLength(1);
      expect(String(warnings[0][0])).toMatch(/ResolversController\.create: .* graphql call runs unguarded/);
    } finally {
      warn.mockRestore();
    }
  });
});

@Controller()
class MessagesController {
  @MessagePattern('orders.create')
  @NoRepeatSubmit({ idempotentKey: '#data.messageId' })
  create() {
    return undefined; // never called: the test hands the interceptor its own handler
  }
}

/**
 * An app that replaced the global `Promise` (Bluebird, or a subclass of its own): an async
 * function still returns a native promise, which `instanceof Promise` then calls no promise. The
 * first message's exchange is one (the guard loads `@nestjs/microservices` then), so this file
 * must not guard a message before this test.
 */
describe('IdempotencyInterceptor where the app replaced the global Promise', () => {
  let app: INestApplication;
  let interceptor: IdempotencyInterceptor;

  beforeAll(async () => {
    ({ app, interceptor } = await guardedApp(MessagesController));
  });
  afterAll(async () => app.close());

  it('guards a message: the first runs the handler, the duplicate gets its result', async () => {
    const native = globalThis.Promise;
    class OtherPromise<T> extends native<T> {}
    let runs = 0;
    const message = () => {
      const ctx = new ExecutionContextHost([{ messageId: 'm-1', orderNo: 'R-1' }, {}], MessagesController, MessagesController.prototype.create);
      ctx.setType('rpc');
      return lastValueFrom(interceptor.intercept(ctx, { handle: () => of({ run: ++runs }) }));
    };
    globalThis.Promise = OtherPromise as PromiseConstructor;
    try {
      expect(await message()).toEqual({ run: 1 });
      expect(await message()).toEqual({ run: 1 });
    } finally {
      globalThis.Promise = native;
    }
    expect(runs).toBe(1);
  });
});
