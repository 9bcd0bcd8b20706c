import { describe, expect, it } from '@jest/globals';
import { Controller, Post } from '@nestjs/common';
import { IdempotencyConfigError } from '../errors/idempotency.errors.js';
import { resolveOptions } from '../idempotency.config.js';
import { NO_REPEAT_SUBMIT_METADATA } from '../idempotency.constants.js';
import { NoRepeatSubmit } from './no-repeat-submit.decorator.js';
import type { NoRepeatSubmitMetadata } from './no-repeat-submit.metadata.js';

describe('@NoRepeatSubmit()', () => {
  it('records the parsed key path on the method', () => {
    class OrdersController {
      @NoRepeatSubmit({ idempotentKey: '#body.order.no', expireSeconds: 60 })
      create() {}
    }
    const metadata: NoRepeatSubmitMetadata = Reflect.getMetadata(
      NO_REPEAT_SUBMIT_METADATA,
      OrdersController.prototype.create,
    );
    expect(metadata.where).toBe('OrdersController.create');
    expect(metadata.key).toHaveProperty('path');
    expect(metadata.options.expireSeconds).toBe(60);
  });

  it('defaults to the Idempotency-Key header, on a class too', () => {
    @NoRepeatSubmit()
    class PaymentsController {}
    const metadata: NoRepeatSubmitMetadata = Reflect.getMetadata(NO_REPEAT_SUBMIT_METADATA, PaymentsController);
    expect(metadata.key).toEqual({ header: true });
    expect(metadata.where).toBe('PaymentsController');
  });

  it.each([
    ['an unknown root', '#cookies.session'],
    ['bad syntax', '#body.[order'],
    ['no #', 'body.orderNo'],
  ])('fails when the class loads on %s, naming the method', (_what, expression) => {
    const define = () => {
      @Controller('orders')
      class OrdersController {
        @Post()
        @NoRepeatSubmit({ idempotentKey: expression })
        create() {}
      }
      return OrdersController;
    };
    expect(define).toThrow(IdempotencyConfigError);
    expect(define).toThrow(/OrdersController\.create/);
  });

  it.each([0, -1, Number.NaN])('refuses expireSeconds %p', (expireSeconds) => {
    const define = () => {
      class OrdersController {
        @NoRepeatSubmit({ expireSeconds })
        create() {}
      }
      return OrdersController;
    };
    expect(define).toThrow(/OrdersController\.create: expireSeconds/);
  });

  it.each([[[500]], [[200, 409]], [[409.5]], ['409']])('refuses saveStatuses %p, on a method and on the module', (saveStatuses) => {
    const define = () => {
      class OrdersController {
        @NoRepeatSubmit({ saveStatuses: saveStatuses as number[] })
        create() {}
      }
      return OrdersController;
    };
    expect(define).toThrow(/OrdersController\.create: saveStatuses must be a list of 4xx statuses/);
    expect(() => resolveOptions({ saveStatuses: saveStatuses as number[] })).toThrow(/IdempotencyModule: saveStatuses/);
  });

  it('takes a list of 4xx statuses or a function; a function is asked about 4xx statuses only', () => {
    class OrdersController {
      @NoRepeatSubmit({ saveStatuses: [400, 409, 499] })
      create() {}
    }
    expect(Reflect.getMetadata(NO_REPEAT_SUBMIT_METADATA, OrdersController.prototype.create).options.saveStatuses).toEqual([400, 409, 499]);
    const asked: number[] = [];
    const { savesStatus } = resolveOptions({ saveStatuses: (status) => (asked.push(status), true) });
    expect([200, 302, 409, 500, 503].map((status) => savesStatus?.(status))).toEqual([false, false, true, false, false]);
    expect(asked).toEqual([409]);
    expect(resolveOptions({}).savesStatus).toBeUndefined();
    expect(resolveOptions({ saveStatuses: [] }).savesStatus).toBeUndefined();
  });
});
