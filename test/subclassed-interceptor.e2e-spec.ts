import { afterAll, beforeAll, beforeEach, describe, expect, it } from '@jest/globals';
import {
  Body,
  Controller,
  Global,
  Inject,
  Injectable,
  Module,
  Post,
  UseInterceptors,
  type DynamicModule,
  type ExecutionContext,
  type INestApplication,
} from '@nestjs/common';
import { NestFactory } from '@nestjs/core';
import { ExpressAdapter } from '@nestjs/platform-express';
import { FastifyAdapter } from '@nestjs/platform-fastify';
import { Test } from '@nestjs/testing';
import { randomUUID } from 'node:crypto';
import {
  IdempotencyConfigError,
  IdempotencyInterceptor,
  IdempotencyModule,
  IdempotencyStore,
  NoRepeatSubmit,
  buildStorageKey,
} from '../libs/idempotency/src/index.js';
import { send, type RawAnswer } from './support/edge-app.js';
import { REDIS_URL } from './support/services.js';

/**
 * A subclass of the guard, given as `IdempotencyModule.forRoot({ interceptor })`, is the guard
 * `@NoRepeatSubmit()` runs: built by Nest with a service of the app injected, in controllers of
 * feature modules that do not import IdempotencyModule. Its users come from a JWT-like header
 * (`Bearer <base64url {"sub": ...}>`) and no `request.user` is ever set: the default guard
 * would file every caller under the shared anonymous namespace, and the second user with a key
 * would get the first one's answer.
 */
@Injectable()
class JwtUsers {
  calls = 0;

  subOf(authorization: string | undefined): string | undefined {
    this.calls++;
    const token = authorization?.match(/^Bearer (\S+)$/)?.[1];
    return token && (JSON.parse(Buffer.from(token, 'base64url').toString('utf8')) as { sub?: string }).sub;
  }
}

@Injectable()
class JwtIdempotencyInterceptor extends IdempotencyInterceptor {
  @Inject(JwtUsers) private readonly users!: JwtUsers;

  protected override getUser(ctx: ExecutionContext): string | undefined {
    return this.users.subOf(ctx.getArgByIndex<{ headers: Record<string, string | undefined> }>(0).headers.authorization);
  }
}

let runs = 0;

@Controller('orders')
class OrdersController {
  @Post()
  @NoRepeatSubmit()
  create(@Body() body: { item: string }) {
    return { run: ++runs, item: body.item };
  }
}

@Controller('carts')
@NoRepeatSubmit()
class CartsController {
  @Post()
  add(@Body() body: { item: string }) {
    return { run: ++runs, item: body.item };
  }
}

/** Feature modules: neither imports IdempotencyModule. */
@Module({ controllers: [OrdersController] })
class OrdersModule {}
@Module({ controllers: [CartsController] })
class CartsModule {}

/** The app's auth module: global in one app, imported by IdempotencyModule alone in the other. */
@Module({ providers: [JwtUsers], exports: [JwtUsers] })
class AuthModule {}
@Global()
@Module({ providers: [JwtUsers], exports: [JwtUsers] })
class GlobalAuthModule {}

const bearer = (sub: string) => `Bearer ${Buffer.from(JSON.stringify({ sub })).toString('base64url')}`;
const outcome = (answer: RawAnswer) =>
  `${answer.status}${answer.headers['idempotent-replayed'] === 'true' ? ' replayed' : ''} run ${JSON.parse(answer.text).run}`;

async function start(adapter: 'express' | 'fastify', imports: DynamicModule['imports']): Promise<{ app: INestApplication; url: string }> {
  @Module({ imports })
  class AppModule {}
  const app = await NestFactory.create(AppModule, adapter === 'fastify' ? new FastifyAdapter() : new ExpressAdapter(), {
    logger: ['error'],
    abortOnError: false,
  });
  await app.listen(0, '127.0.0.1');
  return { app, url: `http://127.0.0.1:${(app.getHttpServer().address() as { port: number }).port}` };
}

const keyPrefix = `subclass-${randomUUID().slice(0, 8)}`;
const WIRINGS = [
  [
    'forRoot({ interceptor }), the service from a global module',
    () => [GlobalAuthModule, IdempotencyModule.forRoot({ store: { redis: REDIS_URL }, keyPrefix, interceptor: JwtIdempotencyInterceptor }), OrdersModule, CartsModule],
  ],
  [
    'forRootAsync({ imports, useFactory, interceptor }), the service from a module only IdempotencyModule imports',
    () => [
      IdempotencyModule.forRootAsync({
        imports: [AuthModule],
        useFactory: () => ({ store: { redis: REDIS_URL }, keyPrefix }),
        interceptor: JwtIdempotencyInterceptor,
      }),
      OrdersModule,
      CartsModule,
    ],
  ],
] as const;

describe.each(['express', 'fastify'] as const)('a subclass of IdempotencyInterceptor (%s)', (adapter) => {
  describe.each(WIRINGS)('given as %s', (_wiring, imports) => {
    let app: INestApplication;
    let url: string;
    let key: string;

    beforeAll(async () => {
      ({ app, url } = await start(adapter, imports()));
    });
    afterAll(async () => app?.close());
    beforeEach(() => {
      key = randomUUID();
      runs = 0;
    });

    it.each(['/orders', '/carts'])(
      'is the guard @NoRepeatSubmit() runs on %s: two users with one key each run once and get their own answer',
      async (path) => {
        const users = app.get(JwtUsers, { strict: false });
        const callsBefore = users.calls;
        const post = (sub: string) => send(url, path, { key, body: { item: 'tea' }, headers: { authorization: bearer(sub) } });
        const alice = await post('alice');
        const bob = await post('bob');
        const aliceAgain = await post('alice');
        const bobAgain = await post('bob');
        expect([alice, bob, aliceAgain, bobAgain].map(outcome)).toEqual(['201 run 1', '201 run 2', '201 replayed run 1', '201 replayed run 2']);
        expect(users.calls - callsBefore).toBe(4);

        const handler = path === '/orders' ? 'OrdersController.create' : 'CartsController.add';
        const store = app.get(IdempotencyStore, { strict: false });
        const record = await store.get(buildStorageKey({ prefix: keyPrefix, user: { id: 'bob' }, handler, key }));
        expect(record?.state).toBe('completed');
      },
    );

    it("is the module's IdempotencyInterceptor provider, built by Nest", () => {
      expect(app.get(IdempotencyInterceptor, { strict: false })).toBeInstanceOf(JwtIdempotencyInterceptor);
    });
  });
});

describe('in a testing module', () => {
  it('overrideProvider(IdempotencyInterceptor) replaces the guard @NoRepeatSubmit() runs', async () => {
    const passThrough = { intercept: (_ctx: ExecutionContext, next: { handle: () => unknown }) => next.handle() };
    const moduleRef = await Test.createTestingModule({ imports: [IdempotencyModule.forRoot({}), OrdersModule] })
      .overrideProvider(IdempotencyInterceptor)
      .useValue(passThrough)
      .compile();
    const app = moduleRef.createNestApplication({ logger: ['error'] });
    await app.listen(0, '127.0.0.1');
    try {
      const url = `http://127.0.0.1:${(app.getHttpServer().address() as { port: number }).port}`;
      runs = 0;
      const key = randomUUID();
      const answers = [await send(url, '/orders', { key, body: { item: 'tea' } }), await send(url, '/orders', { key, body: { item: 'tea' } })];
      expect(answers.map(outcome)).toEqual(['201 run 1', '201 run 2']);
    } finally {
      await app.close();
    }
  });
});

describe('plugging a subclass the wrong way', () => {
  class NotTheGuard {}

  it('refuses a class that does not extend IdempotencyInterceptor, when the module is defined', () => {
    expect(() => IdempotencyModule.forRoot({ interceptor: NotTheGuard as never })).toThrow(IdempotencyConfigError);
    expect(() => IdempotencyModule.forRoot({ interceptor: NotTheGuard as never })).toThrow(/must be IdempotencyInterceptor or a class that extends it/);
  });

  it('refuses an interceptor in the options a forRootAsync() factory returns, at start-up', async () => {
    const imports = [
      GlobalAuthModule,
      IdempotencyModule.forRootAsync({ useFactory: () => ({ interceptor: JwtIdempotencyInterceptor }) as object }),
      OrdersModule,
    ];
    await expect(start('express', imports)).rejects.toThrow(/interceptor goes beside useFactory/);
  });

  it('refuses the subclass named in @UseInterceptors() on a guarded route (two guards, one key), naming the option', async () => {
    @Controller('twice')
    class TwiceController {
      @Post()
      @NoRepeatSubmit()
      @UseInterceptors(JwtIdempotencyInterceptor)
      create() {
        return { run: ++runs };
      }
    }
    @Module({ controllers: [TwiceController] })
    class TwiceModule {}
    await expect(start('express', [GlobalAuthModule, IdempotencyModule.forRoot({}), TwiceModule])).rejects.toThrow(
      /TwiceController\.create: @UseInterceptors\(JwtIdempotencyInterceptor\).*IdempotencyModule\.forRoot\(\{ interceptor: JwtIdempotencyInterceptor \}\)/,
    );
  });
});
