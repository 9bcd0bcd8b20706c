import { afterEach, describe, expect, it, jest } from '@jest/globals';
import { Controller, Injectable, Logger, Module, Post } from '@nestjs/common';
import { APP_INTERCEPTOR } from '@nestjs/core';
import { Test } from '@nestjs/testing';
import { Redis } from 'ioredis';
import { REDIS_URL } from '../../../test/support/services.js';
import { IDEMPOTENCY_RESOLVED_OPTIONS, type ResolvedIdempotencyOptions } from './idempotency.config.js';
import { NoRepeatSubmit } from './decorators/no-repeat-submit.decorator.js';
import { IdempotencyModule } from './idempotency.module.js';
import { IdempotencyAdmin } from './admin/idempotency-admin.service.js';
import { IdempotencyInterceptor } from './interceptors/idempotency.interceptor.js';
import { IdempotencyStore } from './stores/idempotency-store.js';
import { MemoryIdempotencyStore } from './stores/memory/memory-idempotency.store.js';
import { RedisIdempotencyStore } from './stores/redis/redis-idempotency.store.js';

@Injectable()
class ConfigService {
  get(name: string) {
    return { keyPrefix: 'from_config', leaseSeconds: 7 }[name];
  }
}

@Module({ providers: [ConfigService], exports: [ConfigService] })
class ConfigModule {}

describe('IdempotencyModule', () => {
  afterEach(() => {
    jest.restoreAllMocks();
  });

  it('uses the memory store without a store option, and warns once that it is one process only', async () => {
    const warn = jest.spyOn(Logger.prototype, 'warn').mockImplementation(() => undefined);
    const moduleRef = await Test.createTestingModule({ imports: [IdempotencyModule.forRoot({})] }).compile();
    expect(moduleRef.get(IdempotencyStore)).toBeInstanceOf(MemoryIdempotencyStore);
    expect(warn).toHaveBeenCalledTimes(1);
    expect(String(warn.mock.calls[0][0])).toMatch(/one process/);
    await moduleRef.close();
  });

  // An adversarial helper: forRoot() with no argument was a compile error (TS2554), every option being optional.
  it('takes forRoot() with no argument: the memory store, global, every default', async () => {
    jest.spyOn(Logger.prototype, 'warn').mockImplementation(() => undefined);
    const definition = IdempotencyModule.forRoot();
    const moduleRef = await Test.createTestingModule({ imports: [definition] }).compile();
    expect({ global: definition.global, store: moduleRef.get(IdempotencyStore) instanceof MemoryIdempotencyStore }).toEqual({ global: true, store: true });
    await moduleRef.close();
  });

  // An adversarial helper: Nest's own "can't resolve dependencies of the IdempotencyInterceptor (?, ...)" said nothing of the module.
  it('names the missing IdempotencyModule when the guard is an APP_INTERCEPTOR of an app without it', async () => {
    await expect(Test.createTestingModule({ providers: [{ provide: APP_INTERCEPTOR, useClass: IdempotencyInterceptor }] }).compile()).rejects.toThrow(
      /IdempotencyInterceptor is built where no IdempotencyModule is: import IdempotencyModule\.forRoot/,
    );
  });

  // An adversarial helper: a second global module was ignored in silence (its options, its store).
  it('warns once where an app imports two global modules, and not for a global one beside a scoped one', async () => {
    const warn = jest.spyOn(Logger.prototype, 'warn').mockImplementation(() => undefined);
    const store = () => new MemoryIdempotencyStore();
    @Module({ imports: [IdempotencyModule.forRoot({ store: store(), keyPrefix: 'feature' })] })
    class FeatureModule {}
    const twice = await Test.createTestingModule({ imports: [IdempotencyModule.forRoot({ store: store() }), FeatureModule] }).compile();
    const told = warn.mock.calls.map(([message]) => String(message)).filter((message) => /global IdempotencyModules/.test(message));
    expect(told).toEqual([expect.stringMatching(/imports 2 global IdempotencyModules.*isGlobal: false/)]);
    await twice.close();

    warn.mockClear();
    @Module({ imports: [IdempotencyModule.forRoot({ store: store(), keyPrefix: 'scoped', isGlobal: false })] })
    class ScopedModule {}
    const scoped = await Test.createTestingModule({ imports: [IdempotencyModule.forRoot({ store: store() }), ScopedModule] }).compile();
    expect(warn.mock.calls.map(([message]) => String(message)).filter((message) => /global IdempotencyModules/.test(message))).toEqual([]);
    await scoped.close();
  });

  it('merges options over the defaults', async () => {
    const moduleRef = await Test.createTestingModule({
      imports: [IdempotencyModule.forRoot({ store: new MemoryIdempotencyStore(), expireSeconds: 10 })],
    }).compile();
    const options = moduleRef.get<ResolvedIdempotencyOptions>(IDEMPOTENCY_RESOLVED_OPTIONS);
    expect(options).toMatchObject({ keyPrefix: 'no_repeat', expireSeconds: 10, leaseSeconds: 10, maxHoldSeconds: 300, failMode: 'open' });
    expect(Object.isFrozen(options)).toBe(true);
    await moduleRef.close();
  });

  it('configures asynchronously with imports, inject and useFactory', async () => {
    const moduleRef = await Test.createTestingModule({
      imports: [
        IdempotencyModule.forRootAsync({
          imports: [ConfigModule],
          inject: [ConfigService],
          useFactory: (config: ConfigService) => ({
            store: new MemoryIdempotencyStore(),
            keyPrefix: config.get('keyPrefix') as string,
            leaseSeconds: config.get('leaseSeconds') as number,
          }),
        }),
      ],
    }).compile();
    expect(moduleRef.get<ResolvedIdempotencyOptions>(IDEMPOTENCY_RESOLVED_OPTIONS)).toMatchObject({
      keyPrefix: 'from_config',
      leaseSeconds: 7,
    });
    await moduleRef.close();
  });

  it('uses a Redis client it is given and leaves it open on shutdown', async () => {
    const client = new Redis(REDIS_URL, { maxRetriesPerRequest: 0 });
    const moduleRef = await Test.createTestingModule({
      imports: [IdempotencyModule.forRoot({ store: { redis: client } })],
    }).compile();
    await moduleRef.init();
    expect(moduleRef.get(IdempotencyStore)).toBeInstanceOf(RedisIdempotencyStore);
    await moduleRef.close();
    expect(await client.ping()).toBe('PONG');
    await client.quit();
  });

  it('closes a Redis client it opened from a URL on shutdown', async () => {
    const moduleRef = await Test.createTestingModule({
      imports: [IdempotencyModule.forRoot({ store: { redis: REDIS_URL } })],
    }).compile();
    await moduleRef.init();
    const store = moduleRef.get(IdempotencyStore) as RedisIdempotencyStore;
    expect(store.client.status).toBe('ready');
    const ended = new Promise((resolve) => store.client.once('end', resolve));
    await moduleRef.close();
    await ended;
    expect(store.client.status).toBe('end');
  });

  // helper-220: Nest's builder copies a key given as undefined over the extras' default, so
  // `isGlobal: config.global` left unset made the module not global.
  it('is global when isGlobal is given as undefined, in forRoot and beside useFactory', () => {
    expect(IdempotencyModule.forRoot({ store: new MemoryIdempotencyStore(), isGlobal: undefined }).global).toBe(true);
    expect(IdempotencyModule.forRootAsync({ useFactory: () => ({}), isGlobal: undefined }).global).toBe(true);
    expect(IdempotencyModule.forRootAsync({ useFactory: () => ({}), isGlobal: false }).global).toBe(false);
  });

  it('refuses isGlobal in the options a forRootAsync() factory returns (it was ignored), and takes it beside the factory', async () => {
    const factory = () => ({ store: new MemoryIdempotencyStore(), isGlobal: false }) as object;
    await expect(Test.createTestingModule({ imports: [IdempotencyModule.forRootAsync({ useFactory: factory })] }).compile()).rejects.toThrow(
      /isGlobal goes beside useFactory/,
    );
    const beside = await Test.createTestingModule({
      imports: [IdempotencyModule.forRootAsync({ isGlobal: false, useFactory: () => ({ store: new MemoryIdempotencyStore() }) })],
    }).compile();
    await beside.close();
    const inForRoot = await Test.createTestingModule({ imports: [IdempotencyModule.forRoot({ store: new MemoryIdempotencyStore(), isGlobal: false })] }).compile();
    await inForRoot.close();
  });

  // helper-215: a misspelt key in a factory's options started without a word, where TypeScript does
  // not look (a factory's object with one right key, options from the environment): `failmode:
  // 'closed'` failed open, `keyheader` asked for Idempotency-Key, `saveStatus` ran 409s twice.
  it.each([
    [{ failmode: 'closed' }, /unknown option failmode \(did you mean failMode\?\)/],
    [{ keyheader: 'X-Pay-Key', expireSeconds: 60 }, /unknown option keyheader \(did you mean keyHeader\?\)/],
    [{ saveStatus: [409] }, /unknown option saveStatus \(did you mean saveStatuses\?\)/],
    [{ redis: 'redis://127.0.0.1:6379' }, /unknown option redis \(did you mean store: \{ redis \}\?\)/],
    [{ ttl: 60 }, /unknown option ttl;/],
  ])('refuses an unknown option in what a forRootAsync() factory returns, naming it: %j', async (options, message) => {
    await expect(
      Test.createTestingModule({ imports: [IdempotencyModule.forRootAsync({ useFactory: () => ({ store: new MemoryIdempotencyStore(), ...options }) })] }).compile(),
    ).rejects.toThrow(message);
  });

  // helper-216: a module option beside useFactory (JS, options typed any) was taken by Nest as an
  // extra and dropped: failMode: 'closed' there failed open.
  it.each([
    [{ failMode: 'closed' }, /failMode goes in the options useFactory returns, not beside it/],
    [{ failmode: 'closed' }, /unknown option failmode beside useFactory \(did you mean failMode, in the options it returns\?\)/],
    [{ isglobal: false }, /unknown option isglobal beside useFactory \(did you mean isGlobal\?\)/],
  ])('refuses an option beside useFactory that is not isGlobal or interceptor: %j', (beside, message) => {
    expect(() => IdempotencyModule.forRootAsync({ useFactory: () => ({ store: new MemoryIdempotencyStore() }), ...beside } as never)).toThrow(message);
  });

  // helper-220: the decorator checked only the class it decorates; the guard merges a method's
  // options over the nearest class-level decorator up the class chain, so through inheritance or a
  // mixin a keyHeader beside a class's idempotentKey still did nothing, in silence.
  it('refuses at start-up a method keyHeader under its class\'s idempotentKey, inherited or mixed in too', async () => {
    @NoRepeatSubmit({ idempotentKey: '#body.ref' })
    @Controller('payments')
    class PaymentsController {
      @Post()
      @NoRepeatSubmit({ keyHeader: 'X-D' })
      pay() {}
    }
    await expect(Test.createTestingModule({ imports: [IdempotencyModule.forRoot({ store: new MemoryIdempotencyStore() })], controllers: [PaymentsController] }).compile()).rejects.toThrow(
      /PaymentsController.pay: keyHeader X-D would do nothing: the route is keyed by its idempotentKey \(PaymentsController's\)/,
    );

    @NoRepeatSubmit({ idempotentKey: '#body.ref' })
    @Controller()
    abstract class KeyedBase {}
    @Controller('pay')
    class PayController extends KeyedBase {
      @Post()
      @NoRepeatSubmit({ keyHeader: 'X-D' })
      pay() {}
    }
    await expect(Test.createTestingModule({ imports: [IdempotencyModule.forRoot({ store: new MemoryIdempotencyStore() })], controllers: [PayController] }).compile()).rejects.toThrow(
      /PayController.pay: keyHeader X-D would do nothing: the route is keyed by its idempotentKey \(KeyedBase's\)/,
    );

    const WithRefund = <T extends new (...args: any[]) => object>(Base: T) => {
      class Refunds extends Base {
        @Post('refund')
        @NoRepeatSubmit({ keyHeader: 'X-D' })
        refund() {}
      }
      return Refunds;
    };
    class Plain {}
    @NoRepeatSubmit({ idempotentKey: '#body.ref' })
    @Controller('mixed')
    class MixedController extends WithRefund(Plain) {}
    await expect(Test.createTestingModule({ imports: [IdempotencyModule.forRoot({ store: new MemoryIdempotencyStore() })], controllers: [MixedController] }).compile()).rejects.toThrow(
      /Refunds.refund: keyHeader X-D would do nothing: the route is keyed by its idempotentKey \(MixedController's\)/,
    );
  });

  // Also where a bare IdempotencyModule (the class alone, which provides nothing) is the only one.
  it.each([
    ['no IdempotencyModule', []],
    ['a bare IdempotencyModule only', [IdempotencyModule]],
  ])('names the missing IdempotencyModule when a guarded controller is in an app with %s', async (_name, imports) => {
    @Controller('orders')
    class OrdersController {
      @Post()
      @NoRepeatSubmit()
      create() {
        return {};
      }
    }
    await expect(Test.createTestingModule({ imports, controllers: [OrdersController] }).compile()).rejects.toThrow(
      /does not see IdempotencyModule: import IdempotencyModule\.forRoot/,
    );
  });

  // An adversarial helper's first ten minutes: `imports: [IdempotencyModule]` in a feature module,
  // as with other Nest modules, failed with Nest's UnknownExportException (the class alone has no options).
  it('takes a bare IdempotencyModule in a feature module beside forRoot() in the root: the feature sees the global one', async () => {
    @Injectable()
    class Support {
      constructor(readonly admin: IdempotencyAdmin) {}
    }
    @Module({ imports: [IdempotencyModule], providers: [Support], exports: [Support] })
    class SupportModule {}
    const moduleRef = await Test.createTestingModule({ imports: [IdempotencyModule.forRoot({ keyPrefix: 'bare' }), SupportModule] }).compile();
    expect(moduleRef.get(Support).admin).toBe(moduleRef.get(IdempotencyAdmin));
    expect(moduleRef.get(IdempotencyAdmin).storageKeyOf({ user: 1, handler: 'A.b', key: 'k' })).toBe('bare:1:A.b:k');
    await moduleRef.close();
  });

  it.each([undefined, null, ''])('refuses an empty store.redis (%p) at start-up, instead of connecting to localhost', async (redis) => {
    await expect(
      Test.createTestingModule({ imports: [IdempotencyModule.forRoot({ store: { redis: redis as string } })] }).compile(),
    ).rejects.toThrow(/store\.redis is empty/);
  });

  it.each([undefined, null, 'redis://x'])('says a forRootAsync() factory returned no options object (%p)', async (returned) => {
    await expect(
      Test.createTestingModule({ imports: [IdempotencyModule.forRootAsync({ useFactory: () => returned as never })] }).compile(),
    ).rejects.toThrow(/IdempotencyModule: the options are .*, not an object: a forRootAsync\(\) factory/);
  });

  it('bounds the default memory store by memoryMaxEntries and memoryMaxBytes (64 MiB unless given)', async () => {
    jest.spyOn(Logger.prototype, 'warn').mockImplementation(() => undefined);
    const given = await Test.createTestingModule({ imports: [IdempotencyModule.forRoot({ memoryMaxEntries: 7, memoryMaxBytes: 5000 })] }).compile();
    expect(given.get(IdempotencyStore)).toMatchObject({ maxEntries: 7, maxBytes: 5000 });
    const byDefault = await Test.createTestingModule({ imports: [IdempotencyModule.forRoot()] }).compile();
    expect(byDefault.get(IdempotencyStore)).toMatchObject({ maxEntries: 100_000, maxBytes: 64 * 1024 * 1024 });
    await given.close();
    await byDefault.close();
  });

  it.each([{ keyPrefix: 'a:b' }, { keyPrefix: '' }, { keyPrefix: 'p\uD800' }, { expireSeconds: 0 }, { leaseSeconds: -5 }, { memoryMaxBytes: 0 }, { memoryMaxBytes: 1.5 }])(
    'refuses %p at start-up',
    async (options) => {
      await expect(
        Test.createTestingModule({ imports: [IdempotencyModule.forRoot({ store: new MemoryIdempotencyStore(), ...options })] }).compile(),
      ).rejects.toThrow(/IdempotencyModule/);
    },
  );
});
