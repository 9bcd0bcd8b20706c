// A `#params.x` key expression on a route whose path has no `:x` (a typo, a parameter renamed in
// the path but not in the decorator) never finds a key: with `required: false` every call ran
// unguarded, and nothing said so. The guard now says it once per handler (an adversarial
// helper's usability finding, session 20).
import { afterAll, beforeAll, describe, expect, it, jest } from '@jest/globals';
import { Controller, Logger, Param, Post } from '@nestjs/common';
import { NoRepeatSubmit } from '../libs/idempotency/src/index.js';
import { makeApp, send, type Adapter, type EdgeApp } from './support/edge-app.js';

let runs = 0;

@Controller('orders')
class OrdersController {
  @Post(':id/pay')
  @NoRepeatSubmit({ required: false, idempotentKey: '#params.orderId' })
  pay(@Param('id') id: string) {
    runs++;
    return { paid: id };
  }

  @Post(':id/ship')
  @NoRepeatSubmit({ idempotentKey: '#params.shipmentNo' })
  ship(@Param('id') id: string) {
    return { shipped: id };
  }
}

/** An optional parameter, in each router's syntax: a call may leave it out. */
const refunds = (path: string) => {
  @Controller('orders')
  class RefundsController {
    @Post(path)
    @NoRepeatSubmit({ required: false, idempotentKey: '#params.refundNo' })
    refund(@Param('id') id: string) {
      return { refunded: id };
    }
  }
  return RefundsController;
};
const REFUNDS = { express: refunds(':id/refund{/:refundNo}'), fastify: refunds(':id/refund/:refundNo?') };

describe.each<Adapter>(['express', 'fastify'])('a #params key expression that names no parameter of the path (%s)', (adapter) => {
  let a: EdgeApp;
  beforeAll(async () => {
    a = await makeApp(adapter, [OrdersController, REFUNDS[adapter]]);
  });
  afterAll(async () => a?.close());

  it('says once per handler that no call has a key, and how the route answers', async () => {
    const error = jest.spyOn(Logger.prototype, 'error').mockImplementation(() => undefined);
    try {
      runs = 0;
      const paid = await Promise.all([send(a.url, '/orders/7/pay'), send(a.url, '/orders/7/pay')]);
      const shipped = await send(a.url, '/orders/7/ship');
      await send(a.url, '/orders/7/pay');
      // An optional parameter the call left out is a parameter of the path: nothing said.
      await send(a.url, '/orders/7/refund');
      const said = error.mock.calls.map(([message]) => String(message)).filter((message) => message.includes('names no parameter'));
      expect({ statuses: [...paid, shipped].map((r) => r.status), runs }).toEqual({ statuses: [201, 201, 400], runs: 3 });
      expect(said).toHaveLength(2);
      expect(said.find((m) => m.includes('OrdersController.pay'))).toMatch(/#params\.orderId .*\(\/orders\/:id\/pay\).*runs unguarded/);
      expect(said.find((m) => m.includes('OrdersController.ship'))).toMatch(/#params\.shipmentNo .*refused 400 IDEMPOTENCY_KEY_MISSING/);
    } finally {
      error.mockRestore();
    }
  });
});
