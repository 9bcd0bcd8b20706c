// Adversarial review of saveStatuses: the method watcher against decorators users stack, shared
// and inherited handlers, two apps in one process, filters that change the status, async throws,
// request-scoped controllers and concurrent requests whose pipes fail around methods that began.
import { afterAll, beforeAll, describe, expect, it } from '@jest/globals';
import {
  Body,
  Catch,
  ConflictException,
  Controller,
  HttpCode,
  HttpException,
  Injectable,
  Param,
  ParseIntPipe,
  Post,
  Req,
  Res,
  Scope,
  UsePipes,
  type ArgumentsHost,
  type ExceptionFilter,
  type PipeTransform,
} from '@nestjs/common';
import { HttpAdapterHost } from '@nestjs/core';
import { ApiResponse } from '@nestjs/swagger';
import { randomUUID } from 'node:crypto';
import { delay, throwError, timer, mergeMap } from 'rxjs';
import { NoRepeatSubmit } from '../libs/idempotency/src/index.js';
import { makeApp, replayed, send, sleep, type EdgeApp } from './support/edge-app.js';
import { REDIS_URL } from './support/services.js';

const runs: Record<string, number> = {};
const ran = (what: string) => (runs[what] = (runs[what] ?? 0) + 1);

/** A user's method decorator that wraps descriptor.value and checks something first. */
function Audited(): MethodDecorator {
  return (_target, _key, descriptor: PropertyDescriptor) => {
    const original = descriptor.value as (...args: unknown[]) => unknown;
    descriptor.value = function (this: unknown, ...args: unknown[]) {
      ran('audited-wrapper');
      return original.apply(this, args);
    };
  };
}

/** An async pipe that fails for odd ids after a random delay (interleaves with methods that began). */
@Injectable()
class SlowOddPipe implements PipeTransform {
  async transform(value: unknown) {
    await sleep(Math.random() * 20);
    if (Number(value) % 2 === 1) throw new ConflictException({ code: 'PIPE_REFUSED' });
    return value;
  }
}

class BaseOrders {
  @Post(':id')
  @HttpCode(202)
  @ApiResponse({ status: 409 })
  @Audited()
  create(@Param('id', ParseIntPipe) id: number, @Body() body: { sku?: string }) {
    ran(`create:${typeof id}:${body?.sku}`);
    throw new ConflictException({ code: 'EXISTS', id });
  }
}

@Controller('guarded')
@NoRepeatSubmit({ saveStatuses: [409] })
class GuardedOrders extends BaseOrders {}

@Controller('plain')
class PlainOrders extends BaseOrders {}

@Controller('misc')
@NoRepeatSubmit({ saveStatuses: [409, 422] })
class MiscController {
  @Post('async/:id')
  later(@Param('id') id: string) {
    ran('later');
    return timer(30).pipe(mergeMap(() => throwError(() => new ConflictException({ code: 'LATER', id }))));
  }

  @Post('teapot')
  teapot() {
    ran('teapot');
    throw new ConflictException({ code: 'BECOMES_503' });
  }

  @Post('domain')
  domain() {
    ran('domain');
    throw new Error('UNPROCESSABLE');
  }

  @Post('pipe/:id')
  @UsePipes(SlowOddPipe)
  piped(@Param('id') id: string) {
    ran(`piped:${id}`);
    return timer(Math.random() * 20).pipe(
      delay(1),
      mergeMap(() => throwError(() => new ConflictException({ code: 'METHOD', id }))),
    );
  }

  /** What a copy of the request (`{ ...req }`, a logger's serializer) takes along of the guard's. */
  @Post('spread')
  spread(@Req() req: object) {
    return { copied: Object.getOwnPropertySymbols({ ...req }).map((symbol) => symbol.description).filter((name) => name?.startsWith('nestjs-idempotency')) };
  }

  @Post('own')
  own(@Res() res: { status(n: number): { json(b: unknown): void } }) {
    ran('own');
    void res;
    throw new ConflictException({ code: 'OWN' });
  }
}

@Controller({ path: 'scoped', scope: Scope.REQUEST })
@NoRepeatSubmit({ saveStatuses: [409] })
class ScopedController {
  @Post()
  create() {
    ran('scoped');
    throw new ConflictException({ code: 'SCOPED' });
  }
}

/** The app's filter: 409 BECOMES_503 → 503; Error('UNPROCESSABLE') → 422. */
@Catch()
class Filter implements ExceptionFilter {
  constructor(private readonly host: HttpAdapterHost) {}
  catch(error: unknown, host: ArgumentsHost) {
    let status = 500;
    let body: unknown = { code: 'INTERNAL' };
    if (error instanceof HttpException) {
      status = error.getStatus();
      body = error.getResponse();
      if ((body as { code?: string }).code === 'BECOMES_503') status = 503;
    } else if (error instanceof Error && error.message === 'UNPROCESSABLE') {
      status = 422;
      body = { code: 'DOMAIN_422' };
    }
    this.host.httpAdapter.reply(host.switchToHttp().getResponse(), body, status);
  }
}

const reset = () => {
  for (const name of Object.keys(runs)) delete runs[name];
};

describe('saveStatuses under review (express)', () => {
  let one: EdgeApp;
  let two: EdgeApp;
  beforeAll(async () => {
    const setup = (app: import('@nestjs/common').INestApplication) => void app.useGlobalFilters(new Filter(app.get(HttpAdapterHost)));
    one = await makeApp('express', [GuardedOrders, PlainOrders, MiscController, ScopedController], { store: { redis: REDIS_URL }, keyPrefix: `rv1-${randomUUID()}` }, { setup });
    // A second app in the same process sharing the controller classes, with saveStatuses for 409 off module-wide.
    two = await makeApp('express', [GuardedOrders, PlainOrders], { store: { redis: REDIS_URL }, keyPrefix: `rv2-${randomUUID()}` }, { setup });
  });
  afterAll(async () => {
    await one?.close();
    await two?.close();
  });

  it('keeps the metadata decorators put on the method (path, HttpCode, swagger, param decorators)', () => {
    // The guarded subclass has a method of its own in front of the inherited one.
    const method = GuardedOrders.prototype.create;
    expect(method).not.toBe(BaseOrders.prototype.create);
    expect(Reflect.getMetadata('path', method)).toBe(':id');
    expect(Reflect.getMetadata('__httpCode__', method)).toBe(202);
    expect(Reflect.getMetadata('swagger/apiResponse', method)).toBeDefined();
    // The method's own two parameters, and after them the guard's start mark, Nest's @Req() (see markMethodStart).
    const params = (clazz: object) => Object.entries((Reflect.getMetadata('__routeArguments__', clazz, 'create') ?? {}) as Record<string, { index: number }>);
    expect(params(GuardedOrders).map(([key, { index }]) => [key, index])).toEqual([
      ['3:1', 1],
      ['5:0', 0],
      ['0:2', 2],
    ]);
    // The base class's, which PlainOrders shares, are left as they were.
    expect(params(BaseOrders).map(([key]) => key)).toEqual(['3:1', '5:0']);
    expect(Reflect.getMetadata('__interceptors__', BaseOrders.prototype.create)).toBeUndefined();
  });

  it('a guarded subclass saves the 409 of an inherited, wrapped method; an unguarded sibling runs every time', async () => {
    reset();
    const key = randomUUID();
    const g1 = await send(one.url, '/guarded/7', { key, body: { sku: 'a' } });
    const g2 = await send(one.url, '/guarded/7', { key, body: { sku: 'a' } });
    const p1 = await send(one.url, '/plain/7', { key, body: { sku: 'a' } });
    const p2 = await send(one.url, '/plain/7', { key, body: { sku: 'a' } });
    expect([g1.status, replayed(g2), g2.status, p1.status, replayed(p2)]).toEqual([409, true, 409, 409, false]);
    // ParseIntPipe and @Body still reach the method through the watcher and the user's wrapper.
    expect(runs).toEqual({ 'audited-wrapper': 3, 'create:number:a': 3 });
    // A pipe refusal (ParseIntPipe 400) is not saved: the key stays free.
    const bad = randomUUID();
    const b1 = await send(one.url, '/guarded/x', { key: bad, body: {} });
    const b2 = await send(one.url, '/guarded/7', { key: bad, body: {} });
    expect([b1.status, replayed(b2), b2.status]).toEqual([400, false, 409]);
  });

  it('the second app sharing the classes guards and saves on its own', async () => {
    reset();
    const key = randomUUID();
    const a = await send(two.url, '/guarded/3', { key, body: { sku: 'b' } });
    const b = await send(two.url, '/guarded/3', { key, body: { sku: 'b' } });
    expect([a.status, replayed(b), runs['create:number:b']]).toEqual([409, true, 1]);
  });

  it('leaves nothing of its own on the request that a copy of it takes along (helper-193)', async () => {
    const answer = await send(one.url, '/misc/spread', { key: randomUUID(), body: {} });
    // Observed before: { copied: ['nestjs-idempotency.run'] } (an enumerable symbol).
    expect([answer.status, JSON.parse(answer.text)]).toEqual([201, { copied: [] }]);
  });

  it('an asynchronous 409 (Observable error after 30 ms) is saved', async () => {
    reset();
    const key = randomUUID();
    const a = await send(one.url, '/misc/async/1', { key });
    const b = await send(one.url, '/misc/async/1', { key });
    expect([a.status, b.status, replayed(b), runs.later]).toEqual([409, 409, true, 1]);
  });

  it('a filter that turns the 409 into 503 saves nothing; one that turns an Error into 422 saves it', async () => {
    reset();
    const k1 = randomUUID();
    const a = await send(one.url, '/misc/teapot', { key: k1 });
    const b = await send(one.url, '/misc/teapot', { key: k1 });
    expect([a.status, b.status, replayed(b), runs.teapot]).toEqual([503, 503, false, 2]);
    const k2 = randomUUID();
    const c = await send(one.url, '/misc/domain', { key: k2 });
    const d = await send(one.url, '/misc/domain', { key: k2 });
    expect([c.status, d.status, replayed(d), runs.domain]).toEqual([422, 422, true, 1]);
  });

  it('a request-scoped controller: the 409 is saved', async () => {
    reset();
    const key = randomUUID();
    const a = await send(one.url, '/scoped', { key });
    const b = await send(one.url, '/scoped', { key });
    expect([a.status, replayed(b), runs.scoped]).toEqual([409, true, 1]);
  });

  it('a @Res() route whose method throws 409: saved', async () => {
    reset();
    const key = randomUUID();
    const a = await send(one.url, '/misc/own', { key });
    const b = await send(one.url, '/misc/own', { key });
    expect([a.status, replayed(b), runs.own]).toEqual([409, true, 1]);
  });

  it("200 concurrent requests: no pipe refusal is ever saved, every method's 409 is", async () => {
    reset();
    const ids = Array.from({ length: 200 }, (_, i) => i);
    const keys = ids.map(() => randomUUID());
    const firsts = await Promise.all(ids.map((i) => send(one.url, `/misc/pipe/${i}`, { key: keys[i] })));
    const seconds = await Promise.all(ids.map((i) => send(one.url, `/misc/pipe/${i}`, { key: keys[i] })));
    const wrong = ids.filter((i) => (i % 2 === 1 ? replayed(seconds[i]) : !replayed(seconds[i])));
    expect({ wrong, statuses: [...new Set(firsts.map((a) => a.status))] }).toEqual({ wrong: [], statuses: [409] });
  }, 30000);
});
