import { describe, expect, it } from '@jest/globals';
import { Body, Controller, HttpCode, Param, Post, SetMetadata, type ExecutionContext } from '@nestjs/common';
import { AsyncResource } from 'node:async_hooks';
import { defer, lastValueFrom, of } from 'rxjs';
import { NoRepeatSubmit } from '../decorators/no-repeat-submit.decorator.js';
import { guardedRouteMetadata } from '../decorators/no-repeat-submit.metadata.js';
import { ROUTE_ARGS_METADATA, markMethodStart, takesStartMark, watchHandler, watchRouteMethod } from './handler-start.js';

/** A `next` as Nest's interceptors consumer makes it: the rest of the chain bound where `handle()` is called. */
const nextCalling = (call: () => unknown) => ({
  handle: () => {
    const scope = new AsyncResource('next');
    return defer(() => scope.runInAsyncScope(async () => call()));
  },
});

describe('watchRouteMethod', () => {
  it('puts a method in place that keeps the original metadata, name and length, once', () => {
    @Controller('orders')
    class OrdersController {
      @Post()
      @HttpCode(202)
      @SetMetadata('custom', { kept: true })
      @NoRepeatSubmit({ saveStatuses: [409] })
      create(a: number, b: number) {
        return { sum: a + b, self: this };
      }
    }
    const original = OrdersController.prototype.create;
    const keys = Reflect.getOwnMetadataKeys(original);

    const watcher = watchRouteMethod(OrdersController.prototype, 'create');
    expect(watcher).not.toBe(original);
    expect(OrdersController.prototype.create).toBe(watcher);
    expect(Reflect.getOwnMetadataKeys(watcher)).toEqual(keys);
    for (const key of keys) expect(Reflect.getOwnMetadata(key, watcher)).toBe(Reflect.getOwnMetadata(key, original));
    expect({ name: OrdersController.prototype.create.name, length: OrdersController.prototype.create.length }).toEqual({ name: 'create', length: 2 });
    expect(guardedRouteMetadata(OrdersController, watcher)?.options.saveStatuses).toEqual([409]);
    expect(Object.getOwnPropertyDescriptor(OrdersController.prototype, 'create')).toMatchObject({ enumerable: false, writable: true });
    expect(watchRouteMethod(OrdersController.prototype, 'create')).toBe(watcher);

    const instance = new OrdersController();
    expect(instance.create(2, 3)).toEqual({ sum: 5, self: instance });
  });
});

describe('watchHandler', () => {
  class Route {
    calls = 0;
    handle() {
      this.calls++;
      return 'done';
    }
  }
  watchRouteMethod(Route.prototype, 'handle');

  it('says the method began once the chain called it, through the async context of handle()', async () => {
    const route = new Route();
    const watched = watchHandler(nextCalling(() => route.handle()));
    expect(watched.began()).toBe(false);
    await expect(lastValueFrom(watched.handled)).resolves.toBe('done');
    expect(watched.began()).toBe(true);
  });

  it('says it did not begin when the chain failed before the method (a pipe)', async () => {
    const route = new Route();
    const watched = watchHandler(
      nextCalling(() => {
        throw new Error('validation failed');
      }),
    );
    await expect(lastValueFrom(watched.handled)).rejects.toThrow('validation failed');
    expect({ began: watched.began(), calls: route.calls }).toEqual({ began: false, calls: 0 });
  });

  it('is not told by a call outside its run', async () => {
    const route = new Route();
    const watched = watchHandler({ handle: () => of('elsewhere') });
    route.handle();
    await lastValueFrom(watched.handled);
    expect(watched.began()).toBe(false);
  });
});

describe('markMethodStart', () => {
  type Param = { index: number; factory?: (data: unknown, ctx: ExecutionContext) => unknown };
  const paramsOf = (target: object, name: string) =>
    Object.values(Reflect.getMetadata(ROUTE_ARGS_METADATA, target, name) as Record<string, Param>).sort((a, b) => a.index - b.index);
  /** What Nest's router does per request: each parameter's value from its factory, then the method. */
  const callAsNest = (instance: object, name: string, req: object, own: unknown[]) => {
    const mark = paramsOf(instance.constructor, name).find((param) => param.factory)!;
    const ctx = { switchToHttp: () => ({ getRequest: () => req }) } as unknown as ExecutionContext;
    return (instance as Record<string, (...args: unknown[]) => unknown>)[name](...own, mark.factory!(undefined, ctx));
  };

  class OrdersController {
    seen: unknown[][] = [];
    @Post(':id')
    @NoRepeatSubmit({ saveStatuses: [409] })
    create(@Body() dto: unknown, @Param('id') id: string) {
      this.seen.push([...arguments]);
      return { dto, id };
    }
  }
  const watcher = watchRouteMethod(OrdersController.prototype, 'create');
  markMethodStart(OrdersController.prototype, 'create');
  markMethodStart(OrdersController.prototype, 'create');

  it("adds one parameter after the method's own, through which Nest hands the watcher the request's run", async () => {
    expect(paramsOf(OrdersController, 'create').map((param) => param.index)).toEqual([0, 1, 2]);
    expect(takesStartMark(watcher)).toBe(true);
    const route = new OrdersController();
    const req = {};
    const watched = watchHandler(nextCalling(() => callAsNest(route, 'create', req, [{ sku: 'A' }, '7'])), req);
    expect(watched.began()).toBe(false);
    await expect(lastValueFrom(watched.handled)).resolves.toEqual({ dto: { sku: 'A' }, id: '7' });
    expect({ began: watched.began(), seen: route.seen }).toEqual({ began: true, seen: [[{ sku: 'A' }, '7']] });
  });

  it('takes off an empty mark (a request no run watches) and leaves calls of its own alone', () => {
    const route = new OrdersController();
    callAsNest(route, 'create', {}, [1, '2']);
    route.create(3, '4');
    (route.create as (...args: unknown[]) => unknown)(5, '6', 'an argument of the caller');
    expect(route.seen).toEqual([[1, '2'], [3, '4'], [5, '6', 'an argument of the caller']]);
  });

  it("is not told by another request's run", async () => {
    const route = new OrdersController();
    const req = {};
    const watched = watchHandler({ handle: () => of('elsewhere') }, req);
    callAsNest(route, 'create', {}, [1, '2']);
    await lastValueFrom(watched.handled);
    expect(watched.began()).toBe(false);
  });

  it('hands the run over a frozen request too', async () => {
    const route = new OrdersController();
    const req = Object.freeze({});
    const watched = watchHandler(nextCalling(() => callAsNest(route, 'create', req, [1, '2'])), req);
    await lastValueFrom(watched.handled);
    expect(watched.began()).toBe(true);
  });
});
