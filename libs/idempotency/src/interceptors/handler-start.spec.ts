import { describe, expect, it } from '@jest/globals';
import { Body, Controller, HttpCode, Param, Post, SetMetadata } from '@nestjs/common';
import { MessagePattern } from '@nestjs/microservices';
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
  type Param = { index: number };
  const paramsOf = (target: object, name: string) =>
    Object.entries(Reflect.getMetadata(ROUTE_ARGS_METADATA, target, name) as Record<string, Param>)
      .map(([key, { index }]) => [key, index] as const)
      .sort((a, b) => a[1] - b[1]);
  /** What Nest's router does per request: an array as long as the parameters, each in its place, then the method. */
  const callAsNest = (instance: object, name: string, req: object, own: unknown[]) => {
    const params = paramsOf(instance.constructor, name);
    const args: unknown[] = new Array(params[params.length - 1]![1] + 1).fill(undefined);
    own.forEach((value, i) => (args[i] = value));
    args[params.find(([key]) => key.startsWith('0:'))![1]] = req;
    return (instance as Record<string, (...args: unknown[]) => unknown>)[name](...args);
  };
  const request = () => ({ method: 'POST', headers: {}, socket: {} });

  class Paging {
    size = 20;
  }
  class OrdersController {
    seen: unknown[][] = [];
    @Post(':id')
    @NoRepeatSubmit({ saveStatuses: [409] })
    create(@Body() dto: unknown, @Param('id') id: string) {
      this.seen.push([...arguments]);
      return { dto, id };
    }

    @Post()
    @NoRepeatSubmit({ saveStatuses: [409] })
    list(@Body() dto: unknown, paging: Paging = new Paging()) {
      this.seen.push([arguments.length, paging.size]);
      return dto;
    }
  }
  const watcher = watchRouteMethod(OrdersController.prototype, 'create');
  watchRouteMethod(OrdersController.prototype, 'list');
  markMethodStart(OrdersController.prototype, 'create');
  markMethodStart(OrdersController.prototype, 'create');
  markMethodStart(OrdersController.prototype, 'list');

  it("adds Nest's own @Req() after the method's parameters (no pipe sees it), through which the watcher finds the request's run", async () => {
    expect(paramsOf(OrdersController, 'create')).toEqual([
      ['3:0', 0],
      ['5:1', 1],
      ['0:2', 2],
    ]);
    expect(takesStartMark(watcher)).toBe(true);
    const route = new OrdersController();
    const req = request();
    const watched = watchHandler(nextCalling(() => callAsNest(route, 'create', req, [{ sku: 'A' }, '7'])), req);
    expect(watched.began()).toBe(false);
    await expect(lastValueFrom(watched.handled)).resolves.toEqual({ dto: { sku: 'A' }, id: '7' });
    expect({ began: watched.began(), seen: route.seen }).toEqual({ began: true, seen: [[{ sku: 'A' }, '7']] });
  });

  it("puts it past a default parameter without a decorator, which keeps its default", () => {
    expect(paramsOf(OrdersController, 'list')).toEqual([
      ['3:0', 0],
      ['0:2', 2],
    ]);
    const route = new OrdersController();
    callAsNest(route, 'list', request(), [{ sku: 'B' }]);
    expect(route.seen).toEqual([[1, 20]]);
  });

  it('takes the request off where no run watches it, and leaves calls of its own alone', () => {
    const route = new OrdersController();
    callAsNest(route, 'create', request(), [1, '2']);
    route.create(3, '4');
    (route.create as (...args: unknown[]) => unknown)(5, '6', 'an argument of the caller');
    (route.create as (...args: unknown[]) => unknown)(7, '8', { method: 'POST', headers: {} });
    expect(route.seen).toEqual([[1, '2'], [3, '4'], [5, '6', 'an argument of the caller'], [7, '8', { method: 'POST', headers: {} }]]);
  });

  it("is not told by another request's run", async () => {
    const route = new OrdersController();
    const req = request();
    const watched = watchHandler({ handle: () => of('elsewhere') }, req);
    callAsNest(route, 'create', request(), [1, '2']);
    await lastValueFrom(watched.handled);
    expect(watched.began()).toBe(false);
  });

  it('hands the run over a frozen request too', async () => {
    const route = new OrdersController();
    const req = Object.freeze(request());
    const watched = watchHandler(nextCalling(() => callAsNest(route, 'create', req, [1, '2'])), req);
    await lastValueFrom(watched.handled);
    expect({ began: watched.began(), seen: route.seen }).toEqual({ began: true, seen: [[1, '2']] });
  });

  it('leaves a route that is a message handler too to the AsyncLocalStorage (its RPC calls would get a null @Req())', () => {
    class SumController {
      @Post('sum')
      @MessagePattern('sum')
      @NoRepeatSubmit({ saveStatuses: [409] })
      sum(@Body() data: number[]) {
        return data.reduce((a, b) => a + b, 0);
      }
    }
    const sum = watchRouteMethod(SumController.prototype, 'sum');
    markMethodStart(SumController.prototype, 'sum');
    expect({ marked: takesStartMark(sum), params: paramsOf(SumController, 'sum') }).toEqual({ marked: false, params: [['3:0', 0]] });
  });
});
