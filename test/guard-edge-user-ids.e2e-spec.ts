// Users whose id is not a string or a number. The default getUser takes
// `String(request.user.id)`, so every object id is "[object Object]", binary ids (a Buffer, as
// MySQL BINARY(16) UUIDs come back) collapse when they are not UTF-8, and arrays join with commas.
// Two different users then share one namespace, and the second gets the first one's response.
import { afterAll, beforeAll, describe, expect, it } from '@jest/globals';
import { Controller, Injectable, Post, Req, UseGuards, type CanActivate, type ExecutionContext } from '@nestjs/common';
import { randomUUID } from 'node:crypto';
import { NoRepeatSubmit } from '../libs/idempotency/src/index.js';
import { makeApp, replayed, send, type Adapter, type EdgeApp } from './support/edge-app.js';

/** `x-user: <name>` logs in as one of the users below. */
const USERS: Record<string, unknown> = {
  'alice-composite': { id: { tenant: 't1', user: 'alice' } },
  'bob-composite': { id: { tenant: 't2', user: 'bob' } },
  'alice-binary': { id: Buffer.from('ff00aa', 'hex') },
  'bob-binary': { id: Buffer.from('fe00aa', 'hex') },
  'alice-array': { id: ['a,b'] },
  'bob-array': { id: ['a', 'b'] },
};

@Injectable()
class LoginGuard implements CanActivate {
  canActivate(ctx: ExecutionContext): boolean {
    const req = ctx.switchToHttp().getRequest<{ headers: Record<string, string>; user?: unknown }>();
    req.user = USERS[req.headers['x-user']];
    return true;
  }
}

@Controller('account')
@UseGuards(LoginGuard)
class AccountController {
  @Post('statement')
  @NoRepeatSubmit()
  statement(@Req() req: { headers: Record<string, string> }) {
    return { statementOf: req.headers['x-user'] };
  }
}

describe.each<Adapter>(['express', 'fastify'])('users with non-scalar ids (%s)', (adapter) => {
  let a: EdgeApp;
  beforeAll(async () => {
    a = await makeApp(adapter, [AccountController]);
  });
  afterAll(async () => a?.close());

  it.each(['composite', 'binary', 'array'])('%s ids: bob never gets alice\'s response', async (kind) => {
    const key = randomUUID(); // a key both clients happen to send (or bob learned alice's)
    await send(a.url, '/account/statement', { key, headers: { 'x-user': `alice-${kind}` } });
    const bob = await send(a.url, '/account/statement', { key, headers: { 'x-user': `bob-${kind}` } });
    expect({ replayed: replayed(bob), body: bob.text }).not.toEqual({
      replayed: true,
      body: JSON.stringify({ statementOf: `alice-${kind}` }),
    });
  });
});
