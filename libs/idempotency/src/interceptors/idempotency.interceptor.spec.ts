import { afterAll, beforeAll, describe, expect, it, jest } from '@jest/globals';
import { Controller, Logger, Module, Post, type INestApplication } from '@nestjs/common';
import { NestFactory } from '@nestjs/core';
import { ExecutionContextHost } from '@nestjs/core/helpers/execution-context-host.js';
import { ExpressAdapter } from '@nestjs/platform-express';
import { lastValueFrom, of } from 'rxjs';
import { NoRepeatSubmit } from '../decorators/no-repeat-submit.decorator.js';
import { IdempotencyModule } from '../idempotency.module.js';
import { MemoryIdempotencyStore } from '../stores/memory/memory-idempotency.store.js';
import { IdempotencyInterceptor } from './idempotency.interceptor.js';

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
    @Module({ imports: [IdempotencyModule.forRoot({ store: new MemoryIdempotencyStore() })], controllers: [ResolversController] })
    class AppModule {}
    app = await NestFactory.create(AppModule, new ExpressAdapter(), { logger: false });
    await app.init();
    interceptor = app.get(IdempotencyInterceptor);
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
