// @NoRepeatSubmit on a class that is no controller: a GraphQL resolver or a WebSocket gateway (to
// Nest's container a provider, as the plain providers below are; neither package is installed
// here), or a service. The guard keys HTTP requests and messages only: a resolver's mutation ran
// unguarded, said once at its first call, and a service's method never met the guard at all, in
// silence. The app now refuses to start, naming the method.
import { describe, expect, it } from '@jest/globals';
import { Controller, Injectable, Post } from '@nestjs/common';
import { NoRepeatSubmit } from '../libs/idempotency/src/index.js';
import { makeApp, send, type EdgeApp } from './support/edge-app.js';

@Injectable()
class OrdersResolver {
  @NoRepeatSubmit({ idempotentKey: '#body.orderNo' })
  createOrder() {
    return { ok: true };
  }
}

@Injectable()
@NoRepeatSubmit()
class PaymentsService {
  pay() {
    return { paid: true };
  }
}

@Injectable()
class PlainService {
  hello() {
    return 'hi';
  }
}

@Controller('orders')
class OrdersController {
  constructor(private readonly plain: PlainService) {}

  @Post()
  @NoRepeatSubmit()
  create() {
    return { said: this.plain.hello() };
  }
}

describe('@NoRepeatSubmit on a class that is no controller', () => {
  it('refuses to start, naming the method of a resolver-shaped provider', async () => {
    await expect(makeApp('express', [OrdersController], {}, { providers: [PlainService, OrdersResolver] })).rejects.toThrow(
      /OrdersResolver\.createOrder: @NoRepeatSubmit\(\) guards the HTTP routes and message handlers of controllers/,
    );
  });

  // An adversarial helper: a resolver given as a factory or a value was never looked at (its
  // class is known only once made), and 50 copies of one mutation ran it 50 times, in silence.
  it.each([
    ['made by a factory', { provide: OrdersResolver, useFactory: () => new OrdersResolver() }],
    ['given as a value', { provide: OrdersResolver, useValue: new OrdersResolver() }],
    ['made by a factory with dependencies', { provide: 'RESOLVER', useFactory: (_plain: PlainService) => new OrdersResolver(), inject: [PlainService] }],
  ])('refuses to start for a resolver-shaped provider %s', async (_how, provider) => {
    await expect(makeApp('express', [OrdersController], {}, { providers: [PlainService, provider] })).rejects.toThrow(
      /OrdersResolver\.createOrder: @NoRepeatSubmit\(\) guards the HTTP routes and message handlers of controllers/,
    );
  });

  it('refuses to start for a class-level decorator on a service', async () => {
    await expect(makeApp('fastify', [OrdersController], {}, { providers: [PlainService, PaymentsService] })).rejects.toThrow(
      /PaymentsService: @NoRepeatSubmit\(\) guards .* PaymentsService is a provider/,
    );
  });

  it('starts with plain, factory and value providers beside a guarded controller', async () => {
    const app: EdgeApp = await makeApp('express', [OrdersController], {}, {
      providers: [
        PlainService,
        { provide: 'CONFIG', useValue: { a: 1 } },
        { provide: 'CLOCK', useFactory: () => Date, inject: [] },
      ],
    });
    try {
      const answer = await send(app.url, '/orders', { headers: { 'idempotency-key': 'k-1' }, body: {} });
      expect([answer.status, answer.text]).toEqual([201, '{"said":"hi"}']);
    } finally {
      await app.close();
    }
  });
});
