// Passport registered with another property (`PassportModule.register({ property: 'account' })`):
// AuthGuard sets request.account, not request.user. The guard read only request.user, so every
// signed-in caller was anonymous to it, and with a business key (#body.orderNo) the second user
// got the first user's order. It now finds the property when the app starts, and still reads
// request.user, which the app's other guards set (a JWT guard of its own, Passport in a module
// registered without a property).
import { afterAll, beforeAll, describe, expect, it } from '@jest/globals';
import { Body, Controller, Injectable, Post, Req, UseGuards, type CanActivate, type ExecutionContext } from '@nestjs/common';
import { AuthGuard, PassportModule, PassportStrategy } from '@nestjs/passport';
import { Strategy } from 'passport-custom';
import { randomUUID } from 'node:crypto';
import { NoRepeatSubmit } from '../libs/idempotency/src/index.js';
import { makeApp, replayed, send, type Adapter, type EdgeApp } from './support/edge-app.js';

/** Signs a caller in by the `x-user` header (a bearer token's subject in a real app). */
@Injectable()
class HeaderStrategy extends PassportStrategy(Strategy, 'header') {
  validate(req: { headers: Record<string, string | undefined> }) {
    const id = req.headers['x-user'];
    return id ? { id } : false;
  }
}

@Controller('orders')
@UseGuards(AuthGuard('header'))
class OrdersController {
  @Post()
  @NoRepeatSubmit({ idempotentKey: '#body.orderNo' })
  create(@Body() body: { orderNo: string }, @Req() req: { account?: { id: string } }) {
    return { orderNo: body.orderNo, for: req.account?.id };
  }

  /** One welcome order per user: the key is the user's own id. */
  @Post('welcome')
  @NoRepeatSubmit({ idempotentKey: '#user.id' })
  welcome(@Req() req: { account?: { id: string } }) {
    return { welcome: req.account?.id, at: process.hrtime.bigint().toString() };
  }
}

/** Another part of the app: a guard of its own that puts the token's payload on request.user. */
@Injectable()
class PayloadGuard implements CanActivate {
  canActivate(ctx: ExecutionContext): boolean {
    const req = ctx.switchToHttp().getRequest<{ headers: Record<string, string | undefined>; user?: unknown }>();
    const sub = req.headers['x-user'];
    if (!sub) return false;
    req.user = { sub };
    return true;
  }
}

@Controller('invoices')
@UseGuards(PayloadGuard)
class InvoicesController {
  @Post()
  @NoRepeatSubmit({ idempotentKey: '#body.invoiceNo' })
  create(@Body() body: { invoiceNo: string }, @Req() req: { user?: { sub: string } }) {
    return { invoiceNo: body.invoiceNo, for: req.user?.sub };
  }
}

/** Optional sign-in, the usual recipe: without a token Passport's user is `false`, and AuthGuard sets `request.account = false`. */
@Injectable()
class OptionalHeaderGuard extends AuthGuard('header') {
  override handleRequest<T>(_error: unknown, user: T): T {
    return user;
  }
}

/** API clients: a guard of the app's own puts the client on request.user. */
@Injectable()
class ApiKeyGuard implements CanActivate {
  canActivate(ctx: ExecutionContext): boolean {
    const req = ctx.switchToHttp().getRequest<{ headers: Record<string, string | undefined>; user?: unknown }>();
    const client = req.headers['x-api-key'];
    if (client) req.user = { id: client };
    return true;
  }
}

@Controller('payouts')
@UseGuards(OptionalHeaderGuard, ApiKeyGuard)
class PayoutsController {
  @Post()
  @NoRepeatSubmit({ idempotentKey: '#body.ref' })
  create(@Body() body: { ref: string }, @Req() req: { user?: { id: string } }) {
    return { ref: body.ref, client: req.user?.id };
  }
}

describe.each<Adapter>(['express', 'fastify'])('Passport registered with property "account" (%s)', (adapter) => {
  let a: EdgeApp;
  beforeAll(async () => {
    a = await makeApp(adapter, [OrdersController, InvoicesController, PayoutsController], {}, {
      imports: [PassportModule.register({ property: 'account' })],
      providers: [HeaderStrategy],
    });
  });
  afterAll(async () => a?.close());

  it('keys each signed-in user apart: one user\'s order number is not another\'s replay', async () => {
    const orderNo = `1001-${randomUUID()}`;
    const as = (user: string) => send(a.url, '/orders', { body: { orderNo }, headers: { 'x-user': user } });
    const alice = await as('alice');
    expect({ status: alice.status, for: JSON.parse(alice.text).for }).toEqual({ status: 201, for: 'alice' });
    const bob = await as('bob');
    expect({ status: bob.status, replayed: replayed(bob), for: JSON.parse(bob.text).for }).toEqual({ status: 201, replayed: false, for: 'bob' });
    expect(replayed(await as('alice'))).toBe(true);
  });

  it('reads #user.* key expressions from the same place', async () => {
    const as = (user: string) => send(a.url, '/orders/welcome', { headers: { 'x-user': user } });
    const user = `carol-${randomUUID()}`;
    const first = await as(user);
    expect({ status: first.status, welcome: JSON.parse(first.text).welcome }).toEqual({ status: 201, welcome: user });
    const again = await as(user);
    expect({ replayed: replayed(again), body: again.text }).toEqual({ replayed: true, body: first.text });
  });

  it('keeps the users a guard of the app\'s own puts on request.user apart too', async () => {
    const invoiceNo = `INV-${randomUUID()}`;
    const as = (user: string) => send(a.url, '/invoices', { body: { invoiceNo }, headers: { 'x-user': user } });
    expect(JSON.parse((await as('alice')).text).for).toBe('alice');
    const bob = await as('bob');
    expect({ status: bob.status, replayed: replayed(bob), for: JSON.parse(bob.text).for }).toEqual({ status: 201, replayed: false, for: 'bob' });
  });

  // An adversarial helper (session 21): Passport's "no user" (`false` on request.account, from an
  // optional sign-in) hid the API client on request.user: every client was anonymous, and one
  // client's payout was replayed to another that sent the same reference.
  it("reads request.user where Passport's property holds false (no token): one API client never gets another's answer", async () => {
    const ref = `R-${randomUUID()}`;
    const as = (client: string) => send(a.url, '/payouts', { body: { ref }, headers: { 'x-api-key': client } });
    const first = await as('client-a');
    const second = await as('client-b');
    expect({
      statuses: [first.status, second.status],
      clients: [JSON.parse(first.text).client, JSON.parse(second.text).client],
      replayed: replayed(second),
    }).toEqual({ statuses: [201, 201], clients: ['client-a', 'client-b'], replayed: false });
    expect(replayed(await as('client-a'))).toBe(true);
  });
});
