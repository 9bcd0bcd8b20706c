// Two controllers with the same class name (a v1 and an admin module, each with its own
// `OrdersController.create`). The key's handler segment (and the fingerprint's route) is
// `Controller.method`, so both routes would share one namespace: the same user's call to the admin
// route with the key it used on v1 (a business id such as `#body.orderNo`) was answered with v1's
// saved response, and the admin handler never ran. The app now refuses to start, naming both.
import { describe, expect, it } from '@jest/globals';
import { Body, Controller, Post } from '@nestjs/common';
import { NoRepeatSubmit } from '../libs/idempotency/src/index.js';
import { makeApp, replayed, send, type Adapter, type EdgeApp } from './support/edge-app.js';

const runs: string[] = [];

const OrdersV1 = (() => {
  @Controller('v1/orders')
  class OrdersController {
    @Post()
    @NoRepeatSubmit({ idempotentKey: '#body.orderNo' })
    create(@Body() body: { orderNo: string }) {
      runs.push(`v1 ${body.orderNo}`);
      return { api: 'v1', orderNo: body.orderNo };
    }
  }
  return OrdersController;
})();

const AdminOrders = (() => {
  @Controller('admin/orders')
  class OrdersController {
    @Post()
    @NoRepeatSubmit({ idempotentKey: '#body.orderNo' })
    create(@Body() body: { orderNo: string }) {
      runs.push(`admin ${body.orderNo}`);
      return { api: 'admin', orderNo: body.orderNo, approved: true };
    }
  }
  return OrdersController;
})();

describe.each<Adapter>(['express', 'fastify'])('two guarded controllers with one class name (%s)', (adapter) => {
  it('refuse to start, naming the handler, so no route ever replays the other one\'s answers', async () => {
    await expect(makeApp(adapter, [OrdersV1, AdminOrders])).rejects.toThrow(/Two guarded handlers are named OrdersController\.create/);
  });

  it('start when only one of them is in the app', async () => {
    const app: EdgeApp = await makeApp(adapter, [AdminOrders]);
    try {
      const orderNo = `O-${adapter}`;
      const admin = await send(app.url, '/admin/orders', { body: { orderNo } });
      expect({ replayed: replayed(admin), body: JSON.parse(admin.text) }).toEqual({
        replayed: false,
        body: { api: 'admin', orderNo, approved: true },
      });
    } finally {
      await app.close();
    }
  });
});
