import { describe, expect, it } from '@jest/globals';
import { applyDecorators, Controller, Post } from '@nestjs/common';
import { IdempotencyConfigError } from '../errors/idempotency.errors.js';
import { resolveOptions } from '../idempotency.config.js';
import { NO_REPEAT_SUBMIT_METADATA } from '../idempotency.constants.js';
import type { IdempotencyModuleOptions, NoRepeatSubmitOptions } from '../idempotency.options.js';
import { NoRepeatSubmit } from './no-repeat-submit.decorator.js';
import type { NoRepeatSubmitMetadata } from './no-repeat-submit.metadata.js';

/** A controller whose method takes `options` (options as the environment may give them: any type). */
function decoratedWith(options: Record<string, unknown>) {
  class OrdersController {
    @NoRepeatSubmit(options as NoRepeatSubmitOptions)
    create() {}
  }
  return OrdersController;
}

describe('@NoRepeatSubmit()', () => {
  // helper-215: a keyHeader on a route keyed by an idempotentKey did nothing, in silence: two
  // calls with different X-D keys and one ref got one answer.
  // (A method's under its class's, up the class chain: idempotency.module.spec.ts.)
  it('refuses a keyHeader beside an idempotentKey in one decorator', () => {
    expect(() => decoratedWith({ idempotentKey: '#body.ref', keyHeader: 'X-D' })).toThrow(
      /OrdersController.create: keyHeader X-D would do nothing: the route is keyed by its idempotentKey/,
    );
    // A method that brings its own key source with its header is fine.
    @NoRepeatSubmit({ idempotentKey: '#body.ref' })
    class InvoicesController {
      @NoRepeatSubmit({ idempotentKey: "#headers['x-d']" })
      issue() {}
    }
    expect(InvoicesController).toBeDefined();
  });

  // helper-215: options built elsewhere (typed any) with a misspelt key were taken without a word.
  it.each([
    [{ idempotentkey: '#body.ref' }, /OrdersController.create: unknown option idempotentkey \(did you mean idempotentKey\?\)/],
    [{ failmode: 'closed' }, /unknown option failmode \(did you mean failMode\?\)/],
    [{ store: 'redis' }, /unknown option store; /],
  ])('refuses an unknown option, naming it: %j', (options, message) => {
    expect(() => decoratedWith(options)).toThrow(message);
  });

  // The outer one's metadata replaced the inner one's whole, in silence: a custom decorator's
  // key expression was lost under an outer @NoRepeatSubmit({ required: false }), and every copy
  // ran (an adversarial helper: 10 of 10).
  it.each([[[]], [['POST', 'HEAD']]])('refuses methods %p on a controller: it would guard no route, or one never guarded', (methods) => {
    expect(() => {
      @NoRepeatSubmit({ methods: methods as NoRepeatSubmitOptions['methods'] })
      class ReportsController {}
      return ReportsController;
    }).toThrow(/ReportsController: methods must name the request methods to guard, HEAD not among them/);
  });

  it('refuses two on one method (one through a decorator of your own) and two on one class', () => {
    const CreateOrder = () => applyDecorators(Post(), NoRepeatSubmit({ idempotentKey: '#body.orderNo' }));
    expect(() => {
      class OrdersController {
        @NoRepeatSubmit({ required: false })
        @CreateOrder()
        create() {}
      }
      return OrdersController;
    }).toThrow(/OrdersController\.create has two @NoRepeatSubmit\(\) decorators/);
    expect(() => {
      @NoRepeatSubmit({ expireSeconds: 60 })
      @NoRepeatSubmit()
      class InvoicesController {}
      return InvoicesController;
    }).toThrow(/InvoicesController has two @NoRepeatSubmit\(\) decorators/);
    // The same options again lose nothing (a shared method decorated once per subclass, a helper called twice).
    class Shared {
      create() {}
    }
    const again = () =>
      Reflect.decorate([NoRepeatSubmit({ idempotentKey: '#body.no', methods: undefined })], Shared.prototype, 'create', Object.getOwnPropertyDescriptor(Shared.prototype, 'create'));
    again();
    expect(again).not.toThrow();
    // One on a base method and one on the subclass's override: each its own method.
    class Base {
      @NoRepeatSubmit()
      create() {}
    }
    class Sub extends Base {
      @NoRepeatSubmit({ expireSeconds: 60 })
      override create() {}
    }
    expect(Reflect.getMetadata(NO_REPEAT_SUBMIT_METADATA, Sub.prototype.create)).toMatchObject({ options: { expireSeconds: 60 } });
  });

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

  // An adversarial helper (session 19): options read from the environment through ConfigService
  // are strings. failMode 'CLOSED' failed open (the handler ran twice for one key in an outage),
  // and ignoreFields 'nonce' ignored the fields n, o, c and e (another payload was replayed the
  // first answer). Each is refused at start-up, on a method and on the module.
  it.each<[string, Record<string, unknown>, RegExp]>([
    ['failMode', { failMode: 'CLOSED' }, /failMode must be 'open' or 'closed'/],
    ['failMode', { failMode: 'close' }, /failMode must be 'open' or 'closed'/],
    ['ignoreFields', { ignoreFields: 'nonce' }, /ignoreFields must be a list of field names/],
    ['ignoreFields', { ignoreFields: ['nonce', 3] }, /ignoreFields must be a list of field names/],
    // A path matched no field, and every retry that changed it got 422 (an adversarial helper).
    ['ignoreFields', { ignoreFields: ['meta.nonce'] }, /ignoreFields names fields, not paths, .* write "nonce" for "meta.nonce"/],
    ['ignoreFields', { ignoreFields: ["meta['nonce']"] }, /write "nonce" for "meta\['nonce'\]"/],
    ['ignoreFields', { ignoreFields: ['/meta/nonce'] }, /write "nonce" for "\/meta\/nonce"/],
    ['ignoreFields', { ignoreFields: ['a', ' nonce'] }, /write "nonce" for " nonce"/],
    ['required', { required: 'false' }, /required must be true or false/],
    // A trailing space from a .env file: the header never matched, and every call ran unguarded.
    ['keyHeader', { keyHeader: 'Idempotency-Key ' }, /keyHeader must be a header name/],
    ['keyHeader', { keyHeader: 5 }, /keyHeader must be a header name/],
    // Longer than Node's longest timer (24.8 days), a lease's timers fired at once: every run's
    // @LeaseSignal() aborted within a millisecond; past Redis's integers, every save was refused,
    // and each duplicate ran again once the lease ended (an adversarial helper).
    ['leaseSeconds', { leaseSeconds: 30 * 86_400 }, /leaseSeconds must be a positive number of seconds, at most 2,147,483 \(got 2592000\)/],
    ['maxHoldSeconds', { maxHoldSeconds: 315_360_000 }, /maxHoldSeconds must be a positive number of seconds, at most 2,147,483/],
    ['expireSeconds', { expireSeconds: 1e16 }, /expireSeconds must be a positive number of seconds, at most 3,153,600,000/],
    ['expireSeconds', { expireSeconds: '60' }, /expireSeconds must be a positive number of seconds, .*\(got "60"\)/],
  ])('refuses %s given as %p, on a method and on the module', (_name, options, message) => {
    const define = () => decoratedWith(options);
    expect(define).toThrow(IdempotencyConfigError);
    expect(define).toThrow(message);
    expect(() => resolveOptions(options as IdempotencyModuleOptions)).toThrow(message);
  });

  it.each<[string, Record<string, unknown>, RegExp]>([
    ['useRequestFingerprint', { useRequestFingerprint: 'true' }, /useRequestFingerprint must be true or false/],
    ['waitForResultMs', { waitForResultMs: '5000' }, /waitForResultMs must be a number of milliseconds, 0 or more/],
    ['waitForResultMs', { waitForResultMs: -1 }, /waitForResultMs must be a number of milliseconds, 0 or more/],
    ['waitForResultMs', { waitForResultMs: 2 ** 31 }, /waitForResultMs must be a number of milliseconds, 0 or more, at most 2,147,483,000/],
    ['skipIf', { skipIf: 'true' }, /skipIf must be a function/],
    ['methods', { methods: 'POST' }, /methods must be a list of HTTP methods/],
    // It did nothing there, in silence (an adversarial helper).
    ['methods', { methods: ['GET'] }, /methods applies to a controller's routes/],
  ])('refuses %s given as %p on a method', (_name, options, message) => {
    const define = () => decoratedWith(options);
    expect(define).toThrow(message);
  });

  it.each<[string, Record<string, unknown>, RegExp]>([
    ['getUser', { getUser: 'user.id' }, /getUser must be a function/],
    ['onSkippedMessage', { onSkippedMessage: 'settleRmqMessage' }, /onSkippedMessage must be a function/],
    ['onEvent', { onEvent: 'log' }, /onEvent must be a function/],
    ['memoryMaxEntries', { memoryMaxEntries: 'abc' }, /memoryMaxEntries must be a whole number/],
    ['memoryMaxEntries', { memoryMaxEntries: 10n }, /memoryMaxEntries must be a whole number, 1 or more \(got 10\)/],
  ])('refuses %s given as %p on the module', (_name, options, message) => {
    expect(() => resolveOptions(options as IdempotencyModuleOptions)).toThrow(message);
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
