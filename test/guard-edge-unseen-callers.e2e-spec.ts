// Callers the guard could not tell apart (found by an adversarial sweep of real-app wirings):
// - a user that Nest middleware sets on Fastify, where middleware gets the Node.js request, so the
//   user is `request.raw.user`, not `request.user`: every user was anonymous, one namespace, and
//   with business keys (`#body.orderNo`) bob got alice's order;
// - host parameters (`@Controller({ host: ':account.example.com' })`) were not in the
//   fingerprint, though they are the route's as path parameters are: globex got acme's order;
// - a call that carries credentials the guard does not see (a Passport `property`, `req.auth`)
//   is keyed as anonymous without a word.
import { afterAll, beforeAll, describe, expect, it, jest } from '@jest/globals';
import { Body, Controller, HostParam, Logger, Post, Req } from '@nestjs/common';
import { randomUUID } from 'node:crypto';
import { NoRepeatSubmit } from '../libs/idempotency/src/index.js';
import { codeOf, makeApp, replayed, send, type Adapter, type EdgeApp } from './support/edge-app.js';

let runs = 0;

@Controller('orders')
class OrdersController {
  /** Orders numbered by each user (or account) from 1001: the key is only unique per user. */
  @Post()
  @NoRepeatSubmit({ idempotentKey: '#body.orderNo' })
  create(@Body() body: { orderNo: string }, @Req() req: { headers: Record<string, string> }) {
    return { run: ++runs, orderNo: body.orderNo, for: req.headers['x-user'] ?? 'nobody' };
  }
}

@Controller({ path: 'accounts/orders', host: ':account.example.com' })
class AccountOrdersController {
  @Post()
  @NoRepeatSubmit({ idempotentKey: '#body.orderNo' })
  create(@HostParam('account') account: string, @Body() body: { orderNo: string }) {
    return { run: ++runs, account, orderNo: body.orderNo };
  }
}

@Controller({ path: 'sites/orders', host: ['acme.example.com', 'globex.example.com'] })
class SiteOrdersController {
  /** Host-bound without host parameters: the host is still the account. */
  @Post()
  @NoRepeatSubmit({ idempotentKey: '#body.orderNo' })
  create(@Req() req: { headers: Record<string, string> }, @Body() body: { orderNo: string }) {
    return { run: ++runs, host: req.headers.host, orderNo: body.orderNo };
  }
}

/**
 * Nest middleware that logs the caller in from `x-user` (on Fastify it gets the Node.js request):
 * `{ id }`, or with `x-user-shape: string` the id itself, as some Passport strategies leave it.
 */
function login(req: { headers: Record<string, string | undefined>; user?: unknown }, _res: unknown, next: () => void) {
  const id = req.headers['x-user'];
  if (id) req.user = req.headers['x-user-shape'] === 'string' ? id : { id };
  next();
}

describe.each<Adapter>(['express', 'fastify'])('callers the guard could not tell apart (%s)', (adapter) => {
  let a: EdgeApp;
  beforeAll(async () => {
    a = await makeApp(adapter, [OrdersController, AccountOrdersController, SiteOrdersController], {}, { setup: (app) => void app.use(login) });
  });
  afterAll(async () => a?.close());

  it('a user set by Nest middleware is the key\'s user: bob never gets alice\'s order under the same order number', async () => {
    const orderNo = `1001-${randomUUID()}`;
    const alice = await send(a.url, '/orders', { body: { orderNo }, headers: { 'x-user': 'alice' } });
    expect(alice.status).toBe(201);
    const bob = await send(a.url, '/orders', { body: { orderNo }, headers: { 'x-user': 'bob' } });
    // Before the fix, on Fastify: 201 replayed, { for: 'alice' }.
    expect({ status: bob.status, replayed: replayed(bob), for: JSON.parse(bob.text).for }).toEqual({ status: 201, replayed: false, for: 'bob' });
    const again = await send(a.url, '/orders', { body: { orderNo }, headers: { 'x-user': 'bob' } });
    expect([replayed(again), again.text]).toEqual([true, bob.text]);
  });

  it('host parameters are the route\'s: another account\'s order under the same order number is never replayed this one\'s', async () => {
    const orderNo = `1001-${randomUUID()}`;
    const order = (account: string) => send(a.url, '/accounts/orders', { body: { orderNo }, headers: { host: `${account}.example.com` } });
    const acme = await order('acme');
    expect([acme.status, JSON.parse(acme.text).account]).toEqual([201, 'acme']);
    expect(replayed(await order('acme'))).toBe(true);
    const globex = await order('globex');
    // Before the fix: 201 replayed, { account: 'acme' }.
    expect({ status: globex.status, code: codeOf(globex) }).toEqual({ status: 422, code: 'IDEMPOTENCY_KEY_REUSED' });
  });

  it('a user that is its id (a string) is the key\'s user, not refused 500', async () => {
    const orderNo = `1001-${randomUUID()}`;
    const as = (user: string) => send(a.url, '/orders', { body: { orderNo }, headers: { 'x-user': user, 'x-user-shape': 'string' } });
    const alice = await as('alice');
    // Before the fix: 500 IDEMPOTENCY_USER_UNRESOLVED (the default read user.sub: String.prototype.sub, a function).
    expect({ status: alice.status, for: JSON.parse(alice.text).for }).toEqual({ status: 201, for: 'alice' });
    const bob = await as('bob');
    expect({ status: bob.status, replayed: replayed(bob), for: JSON.parse(bob.text).for }).toEqual({ status: 201, replayed: false, for: 'bob' });
    expect(replayed(await as('bob'))).toBe(true);
  });

  it('a host-bound route without host parameters: the host counts, in any letter case', async () => {
    const orderNo = `1001-${randomUUID()}`;
    const order = (host: string) => send(a.url, '/sites/orders', { body: { orderNo }, headers: { host } });
    const acme = await order('acme.example.com');
    expect(acme.status).toBe(201);
    // The router takes ACME.example.com for the same host; so does the fingerprint.
    expect(replayed(await order('ACME.example.com:8443'))).toBe(true);
    const globex = await order('globex.example.com');
    // Before the fix: 201 replayed, { host: 'acme.example.com' }.
    expect({ status: globex.status, code: codeOf(globex) }).toEqual({ status: 422, code: 'IDEMPOTENCY_KEY_REUSED' });
  });

  it('host parameters in another letter case are the same host (a retry is replayed)', async () => {
    const orderNo = `1001-${randomUUID()}`;
    const order = (host: string) => send(a.url, '/accounts/orders', { body: { orderNo }, headers: { host } });
    expect((await order('acme.example.com')).status).toBe(201);
    // Before the fix: 422 (the parameter kept its case: 'ACME').
    expect(replayed(await order('ACME.example.com:443'))).toBe(true);
  });

  it('says once per handler when a call with credentials is keyed as anonymous (a user where the guard does not look)', async () => {
    const warn = jest.spyOn(Logger.prototype, 'warn').mockImplementation(() => undefined);
    try {
      const call = () => send(a.url, '/orders', { body: { orderNo: randomUUID() }, headers: { authorization: 'Bearer token-of-someone' } });
      expect((await call()).status).toBe(201);
      expect((await call()).status).toBe(201);
      const said = warn.mock.calls.map(([message]) => String(message)).filter((message) => message.includes('OrdersController.create') && message.includes('Authorization'));
      expect(said).toHaveLength(1);
      expect(said[0]).toContain('getUser');
    } finally {
      warn.mockRestore();
    }
  });
});
