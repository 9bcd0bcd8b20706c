import { afterAll, beforeAll, describe, expect, it, jest } from '@jest/globals';
import {
  Body,
  Controller,
  Global,
  Inject,
  Injectable,
  Logger,
  Module,
  Post,
  Scope,
  UseGuards,
  UseInterceptors,
  type CanActivate,
  type DynamicModule,
  type ExecutionContext,
  type INestApplication,
} from '@nestjs/common';
import { APP_INTERCEPTOR, NestFactory, REQUEST } from '@nestjs/core';
import { ClientProxyFactory, MessagePattern, Payload, Transport, type ClientProxy, type RedisOptions } from '@nestjs/microservices';
import { ExpressAdapter } from '@nestjs/platform-express';
import { FastifyAdapter } from '@nestjs/platform-fastify';
import { Test } from '@nestjs/testing';
import { randomUUID } from 'node:crypto';
import { firstValueFrom } from 'rxjs';
import {
  IdempotencyInterceptor,
  IdempotencyModule,
  NoRepeatSubmit,
  type GuardedRoute,
  type IdempotencyOptionsFactory,
} from '../libs/idempotency/src/index.js';
import { send, type RawAnswer } from './support/edge-app.js';
import { REDIS_URL } from './support/services.js';

/**
 * A subclass of IdempotencyInterceptor given as forRoot({ interceptor }), in the
 * wirings users have: APP_INTERCEPTOR, two apps in one process, a message pattern, a shared
 * module with isGlobal: false, forRootAsync({ useClass }), overrideProvider in tests.
 */
@Injectable()
class Tenants {
  static built = 0;
  constructor() {
    Tenants.built++;
  }
  userOf(headers: Record<string, string | undefined>): string | undefined {
    return headers['x-tenant-user'];
  }
}

@Global()
@Module({ providers: [Tenants], exports: [Tenants] })
class TenantsModule {}

@Injectable()
class TenantIdempotencyInterceptor extends IdempotencyInterceptor {
  static built = 0;
  @Inject(Tenants) private readonly tenants!: Tenants;

  onModuleInit(): void {
    TenantIdempotencyInterceptor.built++;
  }

  protected override getUser(ctx: ExecutionContext): string | undefined {
    if (ctx.getType() !== 'http') return undefined;
    return this.tenants.userOf(ctx.getArgByIndex<{ headers: Record<string, string | undefined> }>(0).headers);
  }

  /** Messages carry their key as `data.ref`, which no route expression names. */
  protected override getKey(ctx: ExecutionContext, route: GuardedRoute): string | undefined {
    if (ctx.getType() === 'rpc') return ctx.switchToRpc().getData<{ ref?: string }>().ref;
    return super.getKey(ctx, route);
  }
}

/** A second subclass, for the second app in the process: users from another header. */
@Injectable()
class OtherIdempotencyInterceptor extends IdempotencyInterceptor {
  protected override getUser(ctx: ExecutionContext): string | undefined {
    return ctx.getArgByIndex<{ headers: Record<string, string | undefined> }>(0).headers['x-other-user'];
  }
}

let runs = 0;

@Controller('orders')
class OrdersController {
  @Post()
  @NoRepeatSubmit()
  create(@Body() body: { item?: string }) {
    return { run: ++runs, item: body.item };
  }
}

@Module({ controllers: [OrdersController] })
class OrdersModule {}

const outcome = (answer: RawAnswer) =>
  `${answer.status}${answer.headers['idempotent-replayed'] === 'true' ? ' replayed' : ''}${answer.status < 300 ? ` run ${JSON.parse(answer.text).run}` : ''}`;

async function start(imports: DynamicModule['imports'], adapter: 'express' | 'fastify' = 'express', extra: { providers?: unknown[] } = {}) {
  @Module({ imports, providers: (extra.providers ?? []) as never[] })
  class AppModule {}
  const app = await NestFactory.create(AppModule, adapter === 'fastify' ? new FastifyAdapter() : new ExpressAdapter(), {
    logger: false,
    abortOnError: false,
  });
  await app.listen(0, '127.0.0.1');
  return { app, url: `http://127.0.0.1:${(app.getHttpServer().address() as { port: number }).port}` };
}

const prefix = () => `subclass-wiring-${randomUUID().slice(0, 8)}`;
/** Two users, one key: each runs once and gets its own replay. */
async function twoUsers(url: string, header: string): Promise<string[]> {
  const key = randomUUID();
  const post = (user: string) => send(url, '/orders', { key, body: { item: 'tea' }, headers: { [header]: user } });
  return [await post('alice'), await post('bob'), await post('alice'), await post('bob')].map(outcome);
}

describe('a subclass given as forRoot({ interceptor })', () => {
  it('also registered as APP_INTERCEPTOR (useExisting): the app refuses to start, naming forRoot({ interceptor }), instead of answering every first request 409', async () => {
    let started: { app: INestApplication; url: string } | undefined;
    let startError: unknown;
    try {
      started = await start(
        [TenantsModule, IdempotencyModule.forRoot({ store: { redis: REDIS_URL }, keyPrefix: prefix(), interceptor: TenantIdempotencyInterceptor }), OrdersModule],
        'express',
        { providers: [{ provide: APP_INTERCEPTOR, useExisting: IdempotencyInterceptor }] },
      );
    } catch (error) {
      startError = error;
    }
    try {
      // Before the fix: the app started, and every first request was refused 409
      // IDEMPOTENCY_IN_PROGRESS (two guards, one key).
      expect(String(startError)).toMatch(/APP_INTERCEPTOR names IdempotencyInterceptor.*forRoot\(\{ interceptor/);
    } finally {
      await started?.app.close();
    }
  });

  it('also registered as APP_INTERCEPTOR (useClass): the app refuses to start, naming the subclass', async () => {
    await expect(
      start([TenantsModule, IdempotencyModule.forRoot({ keyPrefix: prefix(), interceptor: TenantIdempotencyInterceptor }), OrdersModule], 'fastify', {
        providers: [{ provide: APP_INTERCEPTOR, useClass: TenantIdempotencyInterceptor }],
      }),
    ).rejects.toThrow(/APP_INTERCEPTOR names TenantIdempotencyInterceptor.*forRoot\(\{ interceptor: TenantIdempotencyInterceptor \}\)/);
  });

  it.each([
    ['app.useGlobalInterceptors(app.get(IdempotencyInterceptor))', 'global' as const],
    ['an APP_INTERCEPTOR factory that returns the guard', 'factory' as const],
  ])('given to %s: app.init() refuses, naming forRoot({ interceptor })', async (_wiring, wiring) => {
    @Module({
      imports: [TenantsModule, IdempotencyModule.forRoot({ keyPrefix: prefix(), interceptor: TenantIdempotencyInterceptor }), OrdersModule],
      providers:
        wiring === 'factory'
          ? [{ provide: APP_INTERCEPTOR, inject: [IdempotencyInterceptor], useFactory: (guard: IdempotencyInterceptor) => guard }]
          : [],
    })
    class AppModule {}
    const app = await NestFactory.create(AppModule, new ExpressAdapter(), { logger: false, abortOnError: false });
    try {
      if (wiring === 'global') app.useGlobalInterceptors(app.get(IdempotencyInterceptor));
      await expect(app.init()).rejects.toThrow(/global interceptor .* names TenantIdempotencyInterceptor.*forRoot\(\{ interceptor: TenantIdempotencyInterceptor \}\)/);
    } finally {
      await app.close();
    }
  });

  it('regression: IdempotencyInterceptor itself named by hand in @UseInterceptors() of a feature module: one guard, the subclass', async () => {
    @Controller('by-hand')
    @UseInterceptors(IdempotencyInterceptor)
    class ByHandController {
      @Post()
      @NoRepeatSubmit()
      create() {
        return { run: ++runs };
      }
    }
    const { app, url } = await start([
      TenantsModule,
      IdempotencyModule.forRoot({ keyPrefix: prefix(), interceptor: TenantIdempotencyInterceptor }),
      { module: class ByHandModule {}, controllers: [ByHandController] },
    ]);
    try {
      runs = 0;
      const key = randomUUID();
      const post = (user: string) => send(url, '/by-hand', { key, body: {}, headers: { 'x-tenant-user': user } });
      expect([await post('alice'), await post('bob'), await post('alice')].map(outcome)).toEqual(['201 run 1', '201 run 2', '201 replayed run 1']);
    } finally {
      await app.close();
    }
  });

  it('regression: built once, however many feature modules have guarded controllers', async () => {
    @Controller('a')
    class A {
      @Post()
      @NoRepeatSubmit()
      a() {
        return {};
      }
    }
    @Controller('b')
    class B {
      @Post()
      @NoRepeatSubmit()
      b() {
        return {};
      }
    }
    @Module({ controllers: [A] })
    class AModule {}
    @Module({ controllers: [B] })
    class BModule {}
    const before = TenantIdempotencyInterceptor.built;
    const { app } = await start([
      TenantsModule,
      IdempotencyModule.forRoot({ keyPrefix: prefix(), interceptor: TenantIdempotencyInterceptor }),
      OrdersModule,
      AModule,
      BModule,
    ]);
    await app.close();
    expect(TenantIdempotencyInterceptor.built - before).toBe(1);
  });

  it('regression: two apps in one process, each with its own subclass over one controller class, each runs its own', async () => {
    const one = await start([TenantsModule, IdempotencyModule.forRoot({ store: { redis: REDIS_URL }, keyPrefix: prefix(), interceptor: TenantIdempotencyInterceptor }), OrdersModule]);
    const two = await start([IdempotencyModule.forRoot({ store: { redis: REDIS_URL }, keyPrefix: prefix(), interceptor: OtherIdempotencyInterceptor }), OrdersModule], 'fastify');
    try {
      runs = 0;
      expect(await twoUsers(one.url, 'x-tenant-user')).toEqual(['201 run 1', '201 run 2', '201 replayed run 1', '201 replayed run 2']);
      runs = 0;
      expect(await twoUsers(two.url, 'x-other-user')).toEqual(['201 run 1', '201 run 2', '201 replayed run 1', '201 replayed run 2']);
    } finally {
      await one.app.close();
      await two.app.close();
    }
  });

  it('regression: isGlobal: false, the module imported and re-exported by a shared module: the subclass guards the feature module', async () => {
    @Module({
      imports: [IdempotencyModule.forRoot({ store: { redis: REDIS_URL }, keyPrefix: prefix(), isGlobal: false, interceptor: TenantIdempotencyInterceptor })],
      exports: [IdempotencyModule],
    })
    class SharedModule {}
    @Module({ imports: [SharedModule], controllers: [OrdersController] })
    class FeatureModule {}
    const { app, url } = await start([TenantsModule, FeatureModule]);
    try {
      runs = 0;
      expect(await twoUsers(url, 'x-tenant-user')).toEqual(['201 run 1', '201 run 2', '201 replayed run 1', '201 replayed run 2']);
    } finally {
      await app.close();
    }
  });

  it('regression: forRootAsync({ useClass, interceptor })', async () => {
    const keyPrefix = prefix();
    @Injectable()
    class Config implements IdempotencyOptionsFactory {
      create() {
        return { store: { redis: REDIS_URL }, keyPrefix };
      }
    }
    const { app, url } = await start([TenantsModule, IdempotencyModule.forRootAsync({ useClass: Config, interceptor: TenantIdempotencyInterceptor }), OrdersModule], 'fastify');
    try {
      runs = 0;
      expect(await twoUsers(url, 'x-tenant-user')).toEqual(['201 run 1', '201 run 2', '201 replayed run 1', '201 replayed run 2']);
    } finally {
      await app.close();
    }
  });

  it('regression: overrideProvider(IdempotencyInterceptor).useClass(subclass) in a testing module', async () => {
    const moduleRef = await Test.createTestingModule({
      imports: [TenantsModule, IdempotencyModule.forRoot({ keyPrefix: prefix() }), OrdersModule],
    })
      .overrideProvider(IdempotencyInterceptor)
      .useClass(TenantIdempotencyInterceptor)
      .compile();
    const app = moduleRef.createNestApplication({ logger: false });
    await app.listen(0, '127.0.0.1');
    try {
      const url = `http://127.0.0.1:${(app.getHttpServer().address() as { port: number }).port}`;
      runs = 0;
      expect(await twoUsers(url, 'x-tenant-user')).toEqual(['201 run 1', '201 run 2', '201 replayed run 1', '201 replayed run 2']);
    } finally {
      await app.close();
    }
  });
});

/** A tenant resolver scoped to the request, as multi-tenant apps write them. */
@Injectable({ scope: Scope.REQUEST })
class RequestTenant {
  constructor(@Inject(REQUEST) readonly request: { headers: Record<string, string | undefined> }) {}
}
@Module({ providers: [RequestTenant], exports: [RequestTenant] })
class RequestTenantModule {}

@Injectable()
class RequestTenantIdempotencyInterceptor extends IdempotencyInterceptor {
  static instances = 0;
  readonly instance = ++RequestTenantIdempotencyInterceptor.instances;
  @Inject(RequestTenant) private readonly tenant!: RequestTenant;

  protected override getUser(): string | undefined {
    return this.tenant.request.headers['x-tenant-user'];
  }
}

/** Sets `request.user` with no id: the guard refuses (500) and logs it once per route. */
class ShapelessUser implements CanActivate {
  canActivate(ctx: ExecutionContext): boolean {
    ctx.switchToHttp().getRequest<{ user?: unknown }>().user = { name: 'no id' };
    return true;
  }
}

describe('a subclass that injects a request-scoped provider (a tenant resolver)', () => {
  it('says at start-up, once, that Nest builds it for every request', async () => {
    const warn = jest.spyOn(Logger.prototype, 'warn').mockImplementation(() => undefined);
    try {
      const { app } = await start([
        IdempotencyModule.forRootAsync({ imports: [RequestTenantModule], useFactory: () => ({ keyPrefix: prefix() }), interceptor: RequestTenantIdempotencyInterceptor }),
        OrdersModule,
      ]);
      await app.close();
      const said = warn.mock.calls.map(([message]) => String(message)).filter((message) => message.includes('request-scoped'));
      expect(said).toEqual([expect.stringMatching(/^RequestTenantIdempotencyInterceptor injects a request-scoped provider.*for every request/)]);
    } finally {
      warn.mockRestore();
    }
  });

  it('keeps the guard\'s per-route state: logs "user unresolved" once per route (README), not once per request', async () => {
    @Controller('shapeless')
    class ShapelessController {
      @Post()
      @UseGuards(ShapelessUser)
      @NoRepeatSubmit()
      create() {
        return {};
      }
    }
    const { app, url } = await start([
      IdempotencyModule.forRootAsync({
        imports: [RequestTenantModule],
        useFactory: () => ({ keyPrefix: prefix(), getUser: () => undefined }),
        interceptor: RequestTenantIdempotencyInterceptor,
      }),
      OrdersModule,
      { module: class ShapelessModule {}, controllers: [ShapelessController] },
    ]);
    const errors = jest.spyOn(Logger.prototype, 'error').mockImplementation(() => undefined);
    try {
      const before = RequestTenantIdempotencyInterceptor.instances;
      runs = 0;
      expect(await twoUsers(url, 'x-tenant-user')).toEqual(['201 run 1', '201 run 2', '201 replayed run 1', '201 replayed run 2']);
      for (let i = 0; i < 3; i++) expect((await send(url, '/shapeless', { key: randomUUID(), body: {} })).status).toBe(500);
      const unresolvedLogs = errors.mock.calls.filter(([message]) => String(message).includes('no usable id')).length;
      // The subclass and NoRepeatSubmitInterceptor are request-scoped, so Nest builds a new guard
      // for each of the 7 requests. Before the fix each had an empty route cache and an empty
      // "logged once" set: the "once per route" error was logged 3 times.
      expect(RequestTenantIdempotencyInterceptor.instances - before).toBe(7);
      expect(unresolvedLogs).toBe(1);
    } finally {
      errors.mockRestore();
      await app.close();
    }
  });
});

describe('the subclass on a @MessagePattern handler of a hybrid app', () => {
  let messages = 0;
  @Controller()
  class OrdersRpcController {
    @MessagePattern('wiring.orders.create')
    @NoRepeatSubmit()
    create(@Payload() data: { ref?: string; item: string }) {
      messages++;
      return { item: data.item, run: messages };
    }
  }
  const { hostname: host, port } = new URL(REDIS_URL);
  const pattern = `wiring-${randomUUID().slice(0, 8)}`;
  const transport: RedisOptions = { transport: Transport.REDIS, options: { host, port: Number(port) } };
  let app: INestApplication;
  let client: ClientProxy;

  beforeAll(async () => {
    @Module({
      imports: [TenantsModule, IdempotencyModule.forRoot({ store: { redis: REDIS_URL }, keyPrefix: prefix(), interceptor: TenantIdempotencyInterceptor })],
      controllers: [OrdersRpcController],
    })
    class HybridModule {}
    app = await NestFactory.create(HybridModule, new ExpressAdapter(), { logger: false, abortOnError: false });
    app.connectMicroservice(transport, { inheritAppConfig: true });
    await app.startAllMicroservices();
    await app.init();
    client = ClientProxyFactory.create(transport);
    await client.connect();
  });
  afterAll(async () => {
    await client?.close();
    await app?.close();
  });

  it('regression: runs the subclass getKey (data.ref): a duplicate gets the saved result, another payload IDEMPOTENCY_KEY_REUSED', async () => {
    void pattern;
    const ref = randomUUID();
    const sendMessage = (item: string) => firstValueFrom(client.send<{ run: number }>('wiring.orders.create', { ref, item }));
    const first = await sendMessage('tea');
    expect(await sendMessage('tea')).toEqual(first);
    expect(messages).toBe(1);
    await expect(sendMessage('coffee')).rejects.toMatchObject({ code: 'IDEMPOTENCY_KEY_REUSED' });
  });
});
