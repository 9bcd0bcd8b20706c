// An app whose users sign in with a session cookie (express-session) and a guard of its own that
// reads request.session, with no request.user: the guard keys such calls as anonymous, so with
// business keys one user's retry could be another's answer. The README says to give getUser;
// the guard also says so once per route, as it does for a call with an Authorization header.
import { afterAll, beforeAll, describe, expect, it, jest } from '@jest/globals';
import { Body, Controller, Logger, Post } from '@nestjs/common';
import session from 'express-session';
import { randomUUID } from 'node:crypto';
import { NoRepeatSubmit } from '../libs/idempotency/src/index.js';
import { makeApp, send, type EdgeApp } from './support/edge-app.js';

@Controller('carts')
class CartsController {
  @Post('checkout')
  @NoRepeatSubmit({ idempotentKey: '#body.cartNo' })
  checkout(@Body() body: { cartNo: string }) {
    return { checkedOut: body.cartNo };
  }
}

describe('calls that carry a session, keyed as anonymous (express-session)', () => {
  let a: EdgeApp;
  beforeAll(async () => {
    a = await makeApp('express', [CartsController], {}, {
      setup: (app) => {
        app.use(session({ secret: 'test-only', resave: false, saveUninitialized: true }));
      },
    });
  });
  afterAll(async () => a?.close());

  it('are said once per route, naming getUser', async () => {
    const warn = jest.spyOn(Logger.prototype, 'warn').mockImplementation(() => undefined);
    try {
      const call = () => send(a.url, '/carts/checkout', { body: { cartNo: randomUUID() } });
      expect((await call()).status).toBe(201);
      expect((await call()).status).toBe(201);
      const said = warn.mock.calls
        .map(([message]) => String(message))
        .filter((message) => message.includes('CartsController.checkout') && message.includes('session'));
      expect(said).toHaveLength(1);
      expect(said[0]).toContain('getUser');
    } finally {
      warn.mockRestore();
    }
  });
});
