// Wirings that looked guarded and were not, in silence (an adversarial helper, both adapters):
// an async `skipIf` (a promise is truthy: every call skipped the guard, 11 runs of one key), and
// `@UseInterceptors(IdempotencyInterceptor)` on a route without @NoRepeatSubmit() (the usual
// Nest idiom; it guarded nothing: 10 of 10 copies ran).
import { afterAll, beforeAll, describe, expect, it, jest } from '@jest/globals';
import { Controller, Get, Logger, Post, UseInterceptors, type ExecutionContext } from '@nestjs/common';
import { randomUUID } from 'node:crypto';
import { IdempotencyInterceptor, NoRepeatSubmit, SkipIdempotency } from '../libs/idempotency/src/index.js';
import { makeApp, send, type Adapter, type EdgeApp } from './support/edge-app.js';

let runs = 0;

@Controller('payments')
class PaymentsController {
  @Post()
  @NoRepeatSubmit({ skipIf: (async (ctx: ExecutionContext) => ctx.switchToHttp().getRequest().headers['x-internal'] === 'yes') as never })
  pay() {
    runs++;
    return { paid: runs };
  }
}

@Controller('refunds')
class RefundsController {
  @Post()
  @UseInterceptors(IdempotencyInterceptor)
  refund() {
    return { refunded: true };
  }
}

@Controller('orders')
@NoRepeatSubmit()
@UseInterceptors(IdempotencyInterceptor)
class OrdersController {
  @Get()
  list() {
    return [];
  }

  @Post('import')
  @SkipIdempotency()
  @UseInterceptors(IdempotencyInterceptor)
  import() {
    return { imported: true };
  }
}

describe.each<Adapter>(['express', 'fastify'])('%s: guards that guarded nothing', (adapter) => {
  let a: EdgeApp;
  let warnings: string[];
  beforeAll(async () => {
    const warn = jest.spyOn(Logger.prototype, 'warn').mockImplementation(() => undefined);
    try {
      a = await makeApp(adapter, [PaymentsController, RefundsController, OrdersController]);
    } finally {
      warnings = warn.mock.calls.map((call) => String(call[0]));
      warn.mockRestore();
    }
  });
  afterAll(async () => a?.close());

  it('an async skipIf is a 500 naming it, and the handler does not run', async () => {
    const before = runs;
    const answers = await Promise.all(Array.from({ length: 5 }, () => send(a.url, '/payments', { key: randomUUID() })));
    expect(answers.map((answer) => answer.status)).toEqual([500, 500, 500, 500, 500]);
    expect(runs).toBe(before);
  });

  it('@UseInterceptors(IdempotencyInterceptor) without @NoRepeatSubmit() is named at start-up; reads a class-level guard leaves and skipped routes are not', () => {
    expect(warnings.filter((text) => text.includes('@UseInterceptors()'))).toEqual([
      expect.stringMatching(/^RefundsController\.refund names IdempotencyInterceptor in @UseInterceptors\(\) but has no @NoRepeatSubmit\(\): it is not guarded/),
    ]);
  });
});
