import { describe, expect, it } from '@jest/globals';
import { Controller, HttpCode, Post, SetMetadata } from '@nestjs/common';
import { AsyncResource } from 'node:async_hooks';
import { defer, lastValueFrom, of } from 'rxjs';
import { NoRepeatSubmit } from '../decorators/no-repeat-submit.decorator.js';
import { guardedRouteMetadata } from '../decorators/no-repeat-submit.metadata.js';
import { watchHandler, watchRouteMethod } from './handler-start.js';

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
