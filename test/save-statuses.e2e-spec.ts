// `saveStatuses`: a business refusal the handler answers once it has begun (409 ORDER_EXISTS
// thrown as an HttpException, 402 from the app's exception filter) is saved and replayed like a
// success, as Stripe does, so a retry gets the same refusal without running the handler again.
// What fails before the handler began (a Nest guard, ValidationPipe) is never saved, nor is a
// 5xx; with the option off every error still releases the key. On an app wired as users wire
// one: a global ValidationPipe and a global exception filter that renders every error itself
// (with a counter, so a body rendered again would differ from the saved bytes), on real Redis.
import { afterAll, beforeAll, beforeEach, describe, expect, it, jest } from '@jest/globals';
import {
  BadRequestException,
  Body,
  Catch,
  ConflictException,
  Controller,
  HttpException,
  Injectable,
  Post,
  UseGuards,
  ValidationPipe,
  type ArgumentMetadata,
  type ArgumentsHost,
  type PipeTransform,
  type CanActivate,
  type ExceptionFilter,
  type CallHandler,
  type ExecutionContext,
  type INestApplication,
  type NestInterceptor,
} from '@nestjs/common';
import { APP_INTERCEPTOR, HttpAdapterHost } from '@nestjs/core';
import { IsInt, IsOptional, IsString, Min } from 'class-validator';
import type { Redis } from 'ioredis';
import { AsyncLocalStorage } from 'node:async_hooks';
import { randomUUID } from 'node:crypto';
import { retry, type Observable } from 'rxjs';
import { NoRepeatSubmit, SkipIdempotency, buildStorageKey, type IdempotencyModuleOptions } from '../libs/idempotency/src/index.js';
import { makeApp, replayed, send, sleep, type Adapter, type EdgeApp, type RawAnswer } from './support/edge-app.js';
import { REDIS_URL, connectRedis } from './support/services.js';

class CreateOrderDto {
  @IsString()
  sku!: string;

  @IsInt()
  @Min(1)
  quantity!: number;
}

/** A domain error the app's filter answers 402, as a payment service's client would throw it. */
class PaymentDeclinedError extends Error {}

const runs: Record<string, number> = {};
const ran = (what: string) => (runs[what] = (runs[what] ?? 0) + 1);
let rendered = 0;

/** The app's filter: every error rendered by the app, with a running number (never the same body twice). */
@Catch()
class ApiErrorFilter implements ExceptionFilter {
  constructor(private readonly adapterHost: HttpAdapterHost) {}

  catch(error: unknown, host: ArgumentsHost) {
    let status = 500;
    let body: object = { code: 'INTERNAL' };
    if (error instanceof PaymentDeclinedError) {
      status = 402;
      body = { code: 'PAYMENT_DECLINED', reason: error.message };
    } else if (error instanceof HttpException) {
      status = error.getStatus();
      const response = error.getResponse();
      body = typeof response === 'object' ? response : { message: response };
    }
    this.adapterHost.httpAdapter.reply(host.switchToHttp().getResponse(), { ...body, rendered: ++rendered }, status);
  }
}

/** A Nest guard: it runs before every interceptor, so the idempotency guard never sees its 403. */
@Injectable()
class DenyHeaderGuard implements CanActivate {
  canActivate(ctx: ExecutionContext): boolean {
    return ctx.switchToHttp().getRequest<{ headers: Record<string, string> }>().headers['x-deny'] !== '1';
  }
}

@Controller('orders')
class OrdersController {
  @Post()
  @UseGuards(DenyHeaderGuard)
  @NoRepeatSubmit()
  create(@Body() dto: CreateOrderDto) {
    ran('create');
    if (dto.sku === 'crash') throw new Error('the database went away');
    if (dto.sku === 'unknown') throw new BadRequestException({ code: 'UNKNOWN_SKU' });
    throw new ConflictException({ code: 'ORDER_EXISTS', sku: dto.sku });
  }

  @Post('waiting')
  @NoRepeatSubmit({ waitForResultMs: 5000 })
  async waiting(@Body() dto: CreateOrderDto) {
    ran('waiting');
    await sleep(100);
    throw new ConflictException({ code: 'ORDER_EXISTS', sku: dto.sku });
  }

  @Post('opted-out')
  @NoRepeatSubmit({ saveStatuses: [] })
  optedOut() {
    ran('opted-out');
    throw new ConflictException({ code: 'ORDER_EXISTS' });
  }
}

@Controller('payments')
class PaymentsController {
  @Post()
  @NoRepeatSubmit()
  async pay() {
    ran('pay');
    await sleep(1);
    throw new PaymentDeclinedError('insufficient funds');
  }

  @Post('checked')
  @NoRepeatSubmit({ saveStatuses: (status) => status === 409 })
  checked() {
    ran('checked');
    throw new ConflictException({ code: 'ALREADY_PAID' });
  }
}

const setup = (edge: INestApplication) => {
  edge.useGlobalPipes(new ValidationPipe());
  edge.useGlobalFilters(new ApiErrorFilter(edge.get(HttpAdapterHost)));
};

/** What a replay must repeat: status, content-type and the body bytes. */
const answerOf = (a: RawAnswer) => ({ status: a.status, type: a.headers['content-type'], body: a.text });

let redis: Redis;
beforeAll(async () => {
  redis = await connectRedis();
});
afterAll(() => redis.quit());

describe.each<Adapter>(['express', 'fastify'])('saveStatuses: [400, 402, 409] (%s)', (adapter) => {
  const prefix = `save-statuses-${randomUUID()}`;
  const options: IdempotencyModuleOptions = { store: { redis: REDIS_URL }, keyPrefix: prefix, saveStatuses: [400, 402, 409] };
  const recordOf = (handler: string, key: string) =>
    redis.get(buildStorageKey({ prefix, user: { anonymous: true }, handler, key }));
  let edge: EdgeApp;
  let key: string;
  beforeAll(async () => {
    edge = await makeApp(adapter, [OrdersController, PaymentsController], options, { setup });
  });
  afterAll(() => edge.close());
  beforeEach(() => {
    for (const name of Object.keys(runs)) delete runs[name];
    key = randomUUID();
  });

  it('replays the 409 the handler threw, byte for byte, to a retry and to 10 parallel retries: the handler ran once', async () => {
    const body = { sku: 'A-1', quantity: 1 };
    const first = await send(edge.url, '/orders', { key, body });
    expect(first.status).toBe(409);
    expect(JSON.parse(first.text)).toMatchObject({ code: 'ORDER_EXISTS', sku: 'A-1' });
    expect(replayed(first)).toBe(false);

    const retry = await send(edge.url, '/orders', { key, body });
    const parallel = await Promise.all(Array.from({ length: 10 }, () => send(edge.url, '/orders', { key, body })));
    // Observed before saveStatuses: the retry ran the handler again (runs 12) and nothing was replayed.
    expect({ runs: runs.create, replayed: [retry, ...parallel].filter(replayed).length }).toEqual({ runs: 1, replayed: 11 });
    for (const again of [retry, ...parallel]) expect(answerOf(again)).toEqual(answerOf(first));
  });

  it('gives 10 parallel first requests one run and one answer (waitForResultMs)', async () => {
    const body = { sku: 'B-2', quantity: 2 };
    const answers = await Promise.all(Array.from({ length: 10 }, () => send(edge.url, '/orders/waiting', { key, body })));
    expect({ runs: runs.waiting, firsts: answers.filter((a) => !replayed(a)).length }).toEqual({ runs: 1, firsts: 1 });
    for (const answer of answers) expect(answerOf(answer)).toEqual(answerOf(answers[0]));
    expect(answers[0].status).toBe(409);
  });

  it("replays the 402 the app's filter made of a domain error", async () => {
    const first = await send(edge.url, '/payments', { key });
    const retry = await send(edge.url, '/payments', { key });
    expect(JSON.parse(first.text)).toMatchObject({ code: 'PAYMENT_DECLINED', reason: 'insufficient funds' });
    expect({ runs: runs.pay, replayed: replayed(retry), answer: answerOf(retry) }).toEqual({ runs: 1, replayed: true, answer: answerOf(first) });
    expect(first.status).toBe(402);
  });

  it('replays a 400 the handler threw once it began', async () => {
    const body = { sku: 'unknown', quantity: 1 };
    const first = await send(edge.url, '/orders', { key, body });
    const retry = await send(edge.url, '/orders', { key, body });
    expect(JSON.parse(first.text)).toMatchObject({ code: 'UNKNOWN_SKU' });
    expect({ runs: runs.create, replayed: replayed(retry), answer: answerOf(retry) }).toEqual({ runs: 1, replayed: true, answer: answerOf(first) });
    expect(first.status).toBe(400);
  });

  it("never saves ValidationPipe's 400, a status the route saves (the handler had not begun): the key stays free", async () => {
    const bad = { sku: 'C-3', quantity: 0 };
    const first = await send(edge.url, '/orders', { key, body: bad });
    expect({ status: first.status, replayed: replayed(first), record: await recordOf('OrdersController.create', key) }).toEqual({
      status: 400,
      replayed: false,
      record: null,
    });
    // The same bad body again: the pipe runs again (the filter renders a new body), nothing replayed.
    const again = await send(edge.url, '/orders', { key, body: bad });
    expect({ status: again.status, replayed: replayed(again), same: again.text === first.text }).toEqual({ status: 400, replayed: false, same: false });
    // The corrected body with the same key runs the handler (a saved 400 would answer 422 KEY_REUSED).
    const fixed = await send(edge.url, '/orders', { key, body: { sku: 'C-3', quantity: 1 } });
    expect({ status: fixed.status, replayed: replayed(fixed), runs: runs.create }).toEqual({ status: 409, replayed: false, runs: 1 });
  });

  it("never saves a Nest guard's 403 (it runs before every interceptor)", async () => {
    const body = { sku: 'D-4', quantity: 1 };
    const denied = await send(edge.url, '/orders', { key, body, headers: { 'x-deny': '1' } });
    expect({ status: denied.status, record: await recordOf('OrdersController.create', key) }).toEqual({ status: 403, record: null });
    const allowed = await send(edge.url, '/orders', { key, body });
    expect({ status: allowed.status, replayed: replayed(allowed), runs: runs.create }).toEqual({ status: 409, replayed: false, runs: 1 });
  });

  it('never replays a 500 the handler threw: the key is released and a retry runs it again', async () => {
    const body = { sku: 'crash', quantity: 1 };
    const first = await send(edge.url, '/orders', { key, body });
    expect({ status: first.status, record: await recordOf('OrdersController.create', key) }).toEqual({ status: 500, record: null });
    const retry = await send(edge.url, '/orders', { key, body });
    expect({ status: retry.status, replayed: replayed(retry), runs: runs.create }).toEqual({ status: 500, replayed: false, runs: 2 });
  });

  it('opens no AsyncLocalStorage to know the handler began (on Node 20 one slows every request of the app by ~15 µs)', async () => {
    const opened = [jest.spyOn(AsyncLocalStorage.prototype, 'run'), jest.spyOn(AsyncLocalStorage.prototype, 'enterWith')];
    try {
      const refused = await send(edge.url, '/orders', { key, body: { sku: 'G-7', quantity: 1 } });
      const retry = await send(edge.url, '/orders', { key, body: { sku: 'G-7', quantity: 1 } });
      const invalid = await send(edge.url, '/orders', { key: randomUUID(), body: { sku: 'G-7', quantity: 0 } });
      const declined = await send(edge.url, '/payments', { key: randomUUID() });
      expect({
        statuses: [refused.status, retry.status, invalid.status, declined.status],
        replayed: [replayed(retry), replayed(invalid)],
        runs: runs.create,
      }).toEqual({ statuses: [409, 409, 400, 402], replayed: [true, false], runs: 1 });
      expect(opened.map((spy) => spy.mock.calls.length)).toEqual([0, 0]);
    } finally {
      for (const spy of opened) spy.mockRestore();
    }
  });

  it('lets a route save none (saveStatuses: [])', async () => {
    const first = await send(edge.url, '/orders/opted-out', { key });
    const retry = await send(edge.url, '/orders/opted-out', { key });
    expect({ statuses: [first.status, retry.status], replayed: replayed(retry), runs: runs['opted-out'] }).toEqual({
      statuses: [409, 409],
      replayed: false,
      runs: 2,
    });
  });
});

describe.each<Adapter>(['express', 'fastify'])('saveStatuses unset (%s)', (adapter) => {
  const options: IdempotencyModuleOptions = { store: { redis: REDIS_URL }, keyPrefix: `save-statuses-off-${randomUUID()}` };
  let edge: EdgeApp;
  let key: string;
  beforeAll(async () => {
    edge = await makeApp(adapter, [OrdersController, PaymentsController], options, { setup });
  });
  afterAll(() => edge.close());
  beforeEach(() => {
    for (const name of Object.keys(runs)) delete runs[name];
    key = randomUUID();
  });

  it('releases the key on a 409 as before: the retry runs the handler again', async () => {
    const body = { sku: 'E-5', quantity: 1 };
    const first = await send(edge.url, '/orders', { key, body });
    const retry = await send(edge.url, '/orders', { key, body });
    expect({ statuses: [first.status, retry.status], replayed: replayed(retry), runs: runs.create }).toEqual({
      statuses: [409, 409],
      replayed: false,
      runs: 2,
    });
  });

  it("saves what a route's own function picks (saveStatuses: (status) => status === 409)", async () => {
    const first = await send(edge.url, '/payments/checked', { key });
    const retry = await send(edge.url, '/payments/checked', { key });
    expect({ runs: runs.checked, replayed: replayed(retry), answer: answerOf(retry) }).toEqual({ runs: 1, replayed: true, answer: answerOf(first) });
  });
});

/** An app-wide "resilience" interceptor that retries every error once: it subscribes the guard again. */
class RetryOnce implements NestInterceptor {
  intercept(_ctx: ExecutionContext, next: CallHandler): Observable<unknown> {
    return next.handle().pipe(retry(1));
  }
}

// The guard hands each route's method its run through a parameter of its own (no
// AsyncLocalStorage): a strict global pipe, which sees every parameter, must leave it alone.
describe.each<Adapter>(['express', 'fastify'])('saveStatuses behind a strict global ValidationPipe (%s)', (adapter) => {
  const options: IdempotencyModuleOptions = { store: { redis: REDIS_URL }, keyPrefix: `save-statuses-strict-${randomUUID()}`, saveStatuses: [402, 409] };
  const strict = (edge: INestApplication) => {
    edge.useGlobalPipes(new ValidationPipe({ transform: true, whitelist: true, forbidNonWhitelisted: true, validateCustomDecorators: true }));
    edge.useGlobalFilters(new ApiErrorFilter(edge.get(HttpAdapterHost)));
  };
  let edge: EdgeApp;
  beforeAll(async () => {
    edge = await makeApp(adapter, [OrdersController, PaymentsController], options, { setup: strict });
  });
  afterAll(() => edge.close());

  it("replays the handler's refusals, never the pipe's 400", async () => {
    for (const name of Object.keys(runs)) delete runs[name];
    const [orderKey, paymentKey, badKey] = [randomUUID(), randomUUID(), randomUUID()];
    const body = { sku: 'H-8', quantity: 1 };
    const answers = [
      await send(edge.url, '/orders', { key: orderKey, body }),
      await send(edge.url, '/orders', { key: orderKey, body }),
      await send(edge.url, '/payments', { key: paymentKey }),
      await send(edge.url, '/payments', { key: paymentKey }),
      await send(edge.url, '/orders', { key: badKey, body: { ...body, extra: true } }),
      await send(edge.url, '/orders', { key: badKey, body }),
    ];
    expect({
      statuses: answers.map((answer) => answer.status),
      replayed: answers.map(replayed),
      runs: [runs.create, runs.pay],
    }).toEqual({ statuses: [409, 409, 402, 402, 400, 409], replayed: [false, true, false, true, false, false], runs: [2, 1] });
  });
});

/** A page size: a class, so a strict ValidationPipe validates a parameter of this type. */
class Paging {
  @IsOptional()
  @IsInt()
  size?: number;
}

/** What each call of `list` got: how many arguments, and its default parameter. */
const listCalls: { args: number; size: number | undefined }[] = [];

class BaseLists {
  @Post()
  list(@Body() dto: CreateOrderDto, paging: Paging = { size: 20 }) {
    listCalls.push({ args: arguments.length, size: paging.size });
    ran('list');
    throw new ConflictException({ code: 'LISTED', sku: dto.sku });
  }

  @Post('count')
  count() {
    listCalls.push({ args: arguments.length, size: undefined });
    ran('count');
    throw new ConflictException({ code: 'COUNTED' });
  }
}

@Controller('lists')
@NoRepeatSubmit({ saveStatuses: [409] })
class GuardedLists extends BaseLists {}

/** The same method, unguarded: it must get what it gets without the guard. */
@Controller('plain-lists')
class PlainLists extends BaseLists {}

/** Global pipes as apps have them; each sees every parameter Nest pipes (body, query, params, custom ones). */
const globalPipes: Record<string, PipeTransform> = {
  'a strict ValidationPipe': new ValidationPipe({ transform: true, whitelist: true, forbidNonWhitelisted: true, validateCustomDecorators: true }),
  'a pipe that copies every object': { transform: (value: unknown) => (typeof value === 'object' && value !== null ? { ...value } : value) },
  'a pipe that makes undefined null': { transform: (value: unknown) => (value === undefined ? null : value) },
  'a pipe that refuses custom parameters it does not know': {
    transform: (value: unknown, metadata: ArgumentMetadata) => {
      if (metadata.type === 'custom' && !metadata.metatype) throw new BadRequestException('unknown custom parameter');
      return value;
    },
  },
};

// An adversarial helper: the guard's start mark was a custom parameter, which every global pipe
// saw: validated as a default parameter's class (400 "property began should not exist"),
// copied (the method got an extra argument, refusals unsaved), made null on routes without the
// option, refused (every route answered 400).
describe.each(Object.keys(globalPipes).flatMap((pipe) => (['express', 'fastify'] as const).map((adapter) => [pipe, adapter] as const)))(
  'saveStatuses behind %s (%s)',
  (pipe, adapter) => {
    const options: IdempotencyModuleOptions = { store: { redis: REDIS_URL }, keyPrefix: `save-statuses-pipes-${randomUUID()}`, saveStatuses: [409] };
    let edge: EdgeApp;
    beforeAll(async () => {
      edge = await makeApp(adapter, [GuardedLists, PlainLists], options, { setup: (app) => void app.useGlobalPipes(globalPipes[pipe]!) });
    });
    afterAll(() => edge.close());

    it("saves the method's refusal, and the method gets only its own arguments, guarded or not", async () => {
      for (const name of Object.keys(runs)) delete runs[name];
      listCalls.length = 0;
      const key = randomUUID();
      const body = { sku: 'L-1', quantity: 1 };
      const first = await send(edge.url, '/lists', { key, body });
      const retry = await send(edge.url, '/lists', { key, body });
      const plain = await send(edge.url, '/plain-lists', { key: randomUUID(), body });
      const countKey = randomUUID();
      const counted = [await send(edge.url, '/lists/count', { key: countKey }), await send(edge.url, '/lists/count', { key: countKey })];
      expect({
        statuses: [first.status, retry.status, plain.status, ...counted.map((answer) => answer.status)],
        replayed: [replayed(retry), replayed(counted[1]!)],
        runs: [runs.list, runs.count],
        calls: listCalls,
      }).toEqual({
        statuses: [409, 409, 409, 409, 409],
        replayed: [true, true],
        runs: [2, 1],
        calls: [
          { args: 1, size: 20 },
          { args: 1, size: 20 },
          { args: 0, size: undefined },
        ],
      });
    });
  },
);

/** What each override of `CrudOrders.create` got: how many arguments, and whether its second was a request. */
const overrideCalls: { route: string; args: number; secondIsRequest: boolean }[] = [];
const noteOverride = (route: string, args: IArguments) =>
  overrideCalls.push({ route, args: args.length, secondIsRequest: typeof args[1] === 'object' && args[1] !== null && 'headers' in args[1] });

abstract class CrudOrders {
  @Post()
  @NoRepeatSubmit()
  create(@Body() dto: CreateOrderDto) {
    noteOverride('base', arguments);
    ran('crud');
    throw new ConflictException({ code: 'CRUD', sku: dto.sku });
  }
}

@Controller('crud-users')
class CrudUsers extends CrudOrders {}

/** Overrides without parameter decorators of their own: Nest hands them the base's parameters. */
@Controller('crud-orders')
class CrudOrdersOverride extends CrudOrders {
  @Post()
  @NoRepeatSubmit()
  override create(dto: CreateOrderDto, options?: { dryRun?: boolean }) {
    noteOverride('guarded override', arguments);
    ran('override');
    throw new ConflictException({ code: 'OVERRIDE', sku: dto.sku, dryRun: options?.dryRun ?? false });
  }
}

@Controller('crud-archive')
class CrudArchive extends CrudOrders {
  @Post()
  @SkipIdempotency()
  override create(dto: CreateOrderDto, options?: { dryRun?: boolean }) {
    noteOverride('unguarded override', arguments);
    return { archived: dto.sku, dryRun: options?.dryRun ?? false };
  }
}

// A reviewer: the start mark the base's method got was inherited by overrides that declare no
// parameters of their own (Nest hands them the base's), so an override got the request as its
// second argument, guarded or not.
describe.each<Adapter>(['express', 'fastify'])('saveStatuses on a base class and its overrides (%s)', (adapter) => {
  const options: IdempotencyModuleOptions = { store: { redis: REDIS_URL }, keyPrefix: `save-statuses-crud-${randomUUID()}`, saveStatuses: [409] };
  let edge: EdgeApp;
  beforeAll(async () => {
    edge = await makeApp(adapter, [CrudUsers, CrudOrdersOverride, CrudArchive], options, { setup });
  });
  afterAll(() => edge.close());

  it('gives each method its own arguments only, and saves each guarded refusal', async () => {
    for (const name of Object.keys(runs)) delete runs[name];
    overrideCalls.length = 0;
    const body = { sku: 'O-1', quantity: 1 };
    const [usersKey, ordersKey] = [randomUUID(), randomUUID()];
    const answers = [
      await send(edge.url, '/crud-users', { key: usersKey, body }),
      await send(edge.url, '/crud-users', { key: usersKey, body }),
      await send(edge.url, '/crud-orders', { key: ordersKey, body }),
      await send(edge.url, '/crud-orders', { key: ordersKey, body }),
      await send(edge.url, '/crud-archive', { key: randomUUID(), body }),
    ];
    expect({ statuses: answers.map((answer) => answer.status), replayed: answers.map(replayed), calls: overrideCalls }).toEqual({
      statuses: [409, 409, 409, 409, 201],
      replayed: [false, true, false, true, false],
      calls: [
        { route: 'base', args: 1, secondIsRequest: false },
        { route: 'guarded override', args: 1, secondIsRequest: false },
        { route: 'unguarded override', args: 1, secondIsRequest: false },
      ],
    });
  });
});

describe.each<Adapter>(['express', 'fastify'])('saveStatuses under an outer retry() (%s)', (adapter) => {
  const options: IdempotencyModuleOptions = { store: { redis: REDIS_URL }, keyPrefix: `save-statuses-retry-${randomUUID()}`, saveStatuses: [409] };
  let edge: EdgeApp;
  beforeAll(async () => {
    edge = await makeApp(adapter, [OrdersController], options, { setup, providers: [{ provide: APP_INTERCEPTOR, useClass: RetryOnce }] });
  });
  afterAll(() => edge.close());

  it('runs the handler as often as without the option within the request, then replays its last 409', async () => {
    for (const name of Object.keys(runs)) delete runs[name];
    const key = randomUUID();
    const body = { sku: 'F-6', quantity: 1 };
    const first = await send(edge.url, '/orders', { key, body });
    const retry = await send(edge.url, '/orders', { key, body });
    // Observed with the earlier run still holding the key: 409 IDEMPOTENCY_IN_PROGRESS to every request.
    expect(JSON.parse(first.text)).toMatchObject({ code: 'ORDER_EXISTS' });
    expect({ runs: runs.create, replayed: replayed(retry), answer: answerOf(retry) }).toEqual({ runs: 2, replayed: true, answer: answerOf(first) });
  });
});
