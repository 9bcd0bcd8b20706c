import { afterAll, beforeAll, beforeEach, describe, expect, it } from '@jest/globals';
import { Body, Controller, Get, Injectable, Module, Post, type INestApplication } from '@nestjs/common';
import { NestFactory } from '@nestjs/core';
import { ExpressAdapter } from '@nestjs/platform-express';
import { FastifyAdapter } from '@nestjs/platform-fastify';
import { randomUUID } from 'node:crypto';
import request from 'supertest';
import {
  IdempotencyModule,
  IdempotencyStore,
  InjectIdempotencyStore,
  NoRepeatSubmit,
  SkipIdempotency,
  buildStorageKey,
  type IdempotencyModuleOptions,
  type IdempotencyOptionsFactory,
} from '../libs/idempotency/src/index.js';

/**
 * The conventions Nest users know from @nestjs/throttler and @nestjs/cache-manager: a skip
 * decorator, a class-level decorator that guards writes only, method options merged over class
 * options, a per-call skip, an optional key, an injectable store, an options factory class.
 */
const runs: Record<string, number> = {};
const run = (name: string) => ({ name, run: (runs[name] = (runs[name] ?? 0) + 1) });

@Controller('items')
@NoRepeatSubmit({ expireSeconds: 120 })
class ItemsController {
  @Get()
  list() {
    return run('list');
  }

  @Post()
  create() {
    return run('create');
  }

  @Post('skipped')
  @SkipIdempotency()
  skipped() {
    return run('skipped');
  }

  @Post('merged')
  @NoRepeatSubmit({ idempotentKey: '#body.ref' })
  merged(@Body() _body: { ref: string }) {
    return run('merged');
  }

  @Post('optional')
  @NoRepeatSubmit({ required: false })
  optional() {
    return run('optional');
  }

  @Post('dry-run')
  @NoRepeatSubmit({ skipIf: (ctx) => ctx.switchToHttp().getRequest<{ headers: Record<string, string> }>().headers['x-dry-run'] === '1' })
  dryRun() {
    return run('dryRun');
  }
}

@Controller('reads')
@NoRepeatSubmit({ methods: ['GET', 'POST'] })
class ReadsController {
  @Get()
  read() {
    return run('read');
  }
}

@Injectable()
class StoreUser {
  constructor(@InjectIdempotencyStore() readonly store: IdempotencyStore) {}
}

@Injectable()
class IdempotencyConfig implements IdempotencyOptionsFactory {
  create(): IdempotencyModuleOptions {
    return { keyPrefix: 'conventions', getUser: () => 'u1' };
  }
}

describe.each(['express', 'fastify'] as const)('Nest conventions (%s)', (adapter) => {
  let app: INestApplication;
  const http = () => request(app.getHttpServer());
  let key: string;

  beforeAll(async () => {
    @Module({
      imports: [IdempotencyModule.forRootAsync({ useClass: IdempotencyConfig })],
      controllers: [ItemsController, ReadsController],
      providers: [StoreUser],
    })
    class AppModule {}
    app = await NestFactory.create(AppModule, adapter === 'fastify' ? new FastifyAdapter() : new ExpressAdapter(), { logger: ['error'] });
    await app.init();
    if (adapter === 'fastify') await (app.getHttpAdapter().getInstance() as { ready(): Promise<void> }).ready();
  });
  afterAll(async () => app.close());
  beforeEach(() => {
    key = randomUUID();
    for (const name of Object.keys(runs)) delete runs[name];
  });

  it('guards the writes of a class-level @NoRepeatSubmit, not its reads', async () => {
    expect((await http().get('/items')).status).toBe(200);
    expect((await http().get('/items')).status).toBe(200);
    expect(runs.list).toBe(2);
    const write = await http().post('/items');
    expect([write.status, write.body.code]).toEqual([400, 'IDEMPOTENCY_KEY_MISSING']);
  });

  it('guards the methods a class-level decorator names', async () => {
    const read = await http().get('/reads');
    expect([read.status, read.body.code]).toEqual([400, 'IDEMPOTENCY_KEY_MISSING']);
    expect(runs.read).toBeUndefined();
  });

  it('leaves a @SkipIdempotency() route unguarded under a class-level decorator', async () => {
    expect((await http().post('/items/skipped')).status).toBe(201);
    expect((await http().post('/items/skipped').set('Idempotency-Key', key)).headers['idempotent-replayed']).toBeUndefined();
    expect(runs.skipped).toBe(2);
  });

  it("merges a method's options over its controller's: the method's key, the controller's retention", async () => {
    const ref = randomUUID();
    await http().post('/items/merged').send({ ref });
    const again = await http().post('/items/merged').send({ ref });
    expect(again.headers['idempotent-replayed']).toBe('true');
    const stored = await app.get(IdempotencyStore).get(buildStorageKey({ prefix: 'conventions', user: { id: 'u1' }, handler: 'ItemsController.merged', key: ref }));
    expect(stored?.ttlMs).toBeGreaterThan(60_000);
    expect(stored?.ttlMs).toBeLessThanOrEqual(120_000);
    expect(runs.merged).toBe(1);
  });

  it('runs a required: false route unguarded without a key, and guards it with one', async () => {
    await http().post('/items/optional');
    await http().post('/items/optional');
    await http().post('/items/optional').set('Idempotency-Key', key);
    const replay = await http().post('/items/optional').set('Idempotency-Key', key);
    expect(replay.headers['idempotent-replayed']).toBe('true');
    expect(runs.optional).toBe(3);
  });

  it('runs a call unguarded when skipIf says so', async () => {
    expect((await http().post('/items/dry-run').set('x-dry-run', '1')).status).toBe(201);
    expect((await http().post('/items/dry-run')).status).toBe(400);
    expect(runs.dryRun).toBe(1);
  });

  it('injects the module store with @InjectIdempotencyStore(), and takes options from a factory class', async () => {
    expect(app.get(StoreUser).store).toBe(app.get(IdempotencyStore));
    await http().post('/items').set('Idempotency-Key', key);
    const stored = await app.get(IdempotencyStore).get(buildStorageKey({ prefix: 'conventions', user: { id: 'u1' }, handler: 'ItemsController.create', key }));
    expect(stored?.state).toBe('completed');
  });
});

@Controller('orders')
class OrdersController {
  @Post()
  @NoRepeatSubmit()
  create() {
    return run('order');
  }

  @Post('legacy')
  @NoRepeatSubmit({ keyHeader: 'X-Request-Id' })
  legacy() {
    return run('legacy');
  }
}

describe.each(['express', 'fastify'] as const)('a renamed key header (%s)', (adapter) => {
  let app: INestApplication;
  const http = () => request(app.getHttpServer());

  beforeAll(async () => {
    @Module({
      imports: [IdempotencyModule.forRoot({ keyPrefix: 'header', keyHeader: 'X-Idempotency-Token', getUser: () => 'u1' })],
      controllers: [OrdersController],
    })
    class AppModule {}
    app = await NestFactory.create(AppModule, adapter === 'fastify' ? new FastifyAdapter() : new ExpressAdapter(), { logger: ['error'] });
    await app.init();
    if (adapter === 'fastify') await (app.getHttpAdapter().getInstance() as { ready(): Promise<void> }).ready();
  });
  afterAll(async () => app.close());
  beforeEach(() => {
    for (const name of Object.keys(runs)) delete runs[name];
  });

  it('reads the key from the header the module or the route names, and names it when it is missing', async () => {
    const missing = await http().post('/orders').set('Idempotency-Key', randomUUID());
    expect([missing.status, missing.body.code]).toEqual([400, 'IDEMPOTENCY_KEY_MISSING']);
    expect(missing.body.message).toContain('X-Idempotency-Token');
    const token = randomUUID();
    await http().post('/orders').set('X-Idempotency-Token', token);
    expect((await http().post('/orders').set('x-idempotency-token', token)).headers['idempotent-replayed']).toBe('true');
    const key = randomUUID();
    await http().post('/orders/legacy').set('X-Request-Id', key);
    const again = await http().post('/orders/legacy').set('x-request-id', key);
    expect(again.headers['idempotent-replayed']).toBe('true');
    expect([runs.order, runs.legacy]).toEqual([1, 1]);
  });
});
