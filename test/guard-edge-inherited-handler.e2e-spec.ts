// A generic CRUD base controller (`create` defined once on the base) and two guarded subclasses
// routed at /users and /orders. Nest calls the SAME function object for both routes, and the
// guard once cached each route's settings (its `Controller.method` key segment) by that function
// only: whichever subclass was called first named the key for both, so a client key used on
// /users was replayed on /orders (the orders handler never ran). And when only ONE subclass was
// guarded, the unguarded sibling either turned the guard off for the guarded one (called first)
// or was guarded under the other's name (called second). Routes are now resolved per class.
import { afterAll, beforeAll, describe, expect, it } from '@jest/globals';
import { Body, Controller, HttpCode, Post } from '@nestjs/common';
import { randomUUID } from 'node:crypto';
import { NoRepeatSubmit } from '../libs/idempotency/src/index.js';
import { makeApp, replayed, send, type Adapter, type EdgeApp } from './support/edge-app.js';

const runs: string[] = [];

abstract class CrudController {
  protected abstract readonly kind: string;
  @Post()
  @HttpCode(200)
  create(@Body() body: { name: string }) {
    runs.push(`${this.kind} ${body.name}`);
    return { kind: this.kind, name: body.name };
  }
}

@Controller('users')
@NoRepeatSubmit()
class UsersController extends CrudController {
  protected readonly kind = 'user';
}

@Controller('orders')
@NoRepeatSubmit()
class OrdersController extends CrudController {
  protected readonly kind = 'order';
}

// One guarded subclass and one unguarded one of another base.
abstract class AuditBase {
  protected abstract readonly kind: string;
  @Post()
  @HttpCode(200)
  record(@Body() body: { name: string }) {
    runs.push(`${this.kind} ${body.name}`);
    return { kind: this.kind, name: body.name };
  }
}

@Controller('guarded-audit')
@NoRepeatSubmit()
class GuardedAudit extends AuditBase {
  protected readonly kind = 'guarded';
}

@Controller('plain-audit')
class PlainAudit extends AuditBase {
  protected readonly kind = 'plain';
}

describe.each<Adapter>(['express', 'fastify'])('guarded subclasses sharing a base method (%s)', (adapter) => {
  let app: EdgeApp;
  beforeAll(async () => {
    app = await makeApp(adapter, [UsersController, OrdersController, PlainAudit, GuardedAudit]);
  });
  afterAll(() => app.close());

  it('keeps /users and /orders apart: the same client key on the other route runs that route', async () => {
    const key = randomUUID();
    const user = await send(app.url, '/users', { key, body: { name: 'x' } });
    const order = await send(app.url, '/orders', { key, body: { name: 'x' } });
    expect(JSON.parse(user.text)).toEqual({ kind: 'user', name: 'x' });
    // Observed: 200 { kind: 'user' } with Idempotent-Replayed: true; the orders handler never ran.
    expect({ replayed: replayed(order), body: JSON.parse(order.text) }).toEqual({
      replayed: false,
      body: { kind: 'order', name: 'x' },
    });
  });

  it('guards the guarded subclass even when its unguarded sibling was called first', async () => {
    // the unguarded sibling first: it caches "no guard" for the shared function
    await send(app.url, '/plain-audit', { body: { name: 'p' } });
    const key = randomUUID();
    const before = runs.length;
    const first = await send(app.url, '/guarded-audit', { key, body: { name: 'g' } });
    const second = await send(app.url, '/guarded-audit', { key, body: { name: 'g' } });
    expect(first.status).toBe(200);
    // Observed: both ran (no replay): the guard is off on /guarded-audit.
    expect({ runs: runs.length - before, replayed: replayed(second) }).toEqual({ runs: 1, replayed: true });
  });
});
