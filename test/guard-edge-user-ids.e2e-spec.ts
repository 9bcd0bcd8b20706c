// Users whose id is not a string or a number. The default getUser takes
// `String(request.user.id)`, so every object id is "[object Object]", binary ids (a Buffer, as
// MySQL BINARY(16) UUIDs come back) collapse when they are not UTF-8, and arrays join with commas.
// Two different users then share one namespace, and the second gets the first one's response.
import { afterAll, beforeAll, describe, expect, it, jest } from '@jest/globals';
import { Controller, Injectable, Logger, Post, Req, UseGuards, type CanActivate, type ExecutionContext } from '@nestjs/common';
import { randomUUID } from 'node:crypto';
import { NoRepeatSubmit } from '../libs/idempotency/src/index.js';
import { idText, userOfId } from '../libs/idempotency/src/interceptors/key-user.js';
import { codeOf, makeApp, replayed, send, type Adapter, type EdgeApp } from './support/edge-app.js';

/** `x-user: <name>` logs in as one of the users below. */
const USERS: Record<string, unknown> = {
  'alice-composite': { id: { tenant: 't1', user: 'alice' } },
  'bob-composite': { id: { tenant: 't2', user: 'bob' } },
  'alice-binary': { id: Buffer.from('ff00aa', 'hex') },
  'bob-binary': { id: Buffer.from('fe00aa', 'hex') },
  'alice-array': { id: ['a,b'] },
  'bob-array': { id: ['a', 'b'] },
  // A session-21 helper: a one-element list was read as the parts a getUser may give, so it was
  // the plain id's user, and bob got alice's answer. Lists are parts from getUser only.
  'alice-listed': { id: 'q-1' },
  'bob-listed': { id: ['q-1'] },
};

/** A guard that logs in as `users[x-user]`. */
function loginFrom(users: Record<string, unknown>) {
  @Injectable()
  class LoginGuard implements CanActivate {
    canActivate(ctx: ExecutionContext): boolean {
      const req = ctx.switchToHttp().getRequest<{ headers: Record<string, string>; user?: unknown }>();
      req.user = users[req.headers['x-user']];
      return true;
    }
  }
  return LoginGuard;
}
const LoginGuard = loginFrom(USERS);

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

  it('refuses a listed id 500 (a list is parts from getUser only), and keys the plain one', async () => {
    const key = randomUUID();
    const alice = await send(a.url, '/account/statement', { key, headers: { 'x-user': 'alice-listed' } });
    const bob = await send(a.url, '/account/statement', { key, headers: { 'x-user': 'bob-listed' } });
    expect({ statuses: [alice.status, bob.status], code: codeOf(bob) }).toEqual({ statuses: [201, 500], code: 'IDEMPOTENCY_USER_UNRESOLVED' });
  });

  it.each(['composite', 'binary', 'array', 'listed'])('%s ids: bob never gets alice\'s response', async (kind) => {
    const key = randomUUID(); // a key both clients happen to send (or bob learned alice's)
    await send(a.url, '/account/statement', { key, headers: { 'x-user': `alice-${kind}` } });
    const bob = await send(a.url, '/account/statement', { key, headers: { 'x-user': `bob-${kind}` } });
    expect({ replayed: replayed(bob), body: bob.text }).not.toEqual({
      replayed: true,
      body: JSON.stringify({ statementOf: `alice-${kind}` }),
    });
  });
});

// The README's tenant recipe, `getUser: (ctx) => `${tenant}:${id}``, over Nest's JWT users
// (`{ sub, username, tenantId }`, no `id`): every user of a tenant was `t1:undefined`, and Bob got
// Alice's answer as a replay (an adversarial helper). A text with what a template writes for a
// missing field is no user id: refused 500 IDEMPOTENCY_USER_UNRESOLVED, nothing runs.
const JWT_USERS: Record<string, unknown> = {
  alice: { sub: 'u-alice', username: 'alice', tenantId: 't1' },
  bob: { sub: 'u-bob', username: 'bob', tenantId: 't1' },
};

const JwtLikeGuard = loginFrom(JWT_USERS);

let orders = 0;

/** Orders keyed by their business number, for the users `guard` signs in; each run counted in `orders`. */
function ordersController(path: string, guard: ReturnType<typeof loginFrom>) {
  @Controller(path)
  @UseGuards(guard)
  class OrdersController {
    @Post()
    @NoRepeatSubmit({ idempotentKey: '#body.orderNo' })
    create(@Req() req: { headers: Record<string, string> }) {
      orders++;
      return { orderOf: req.headers['x-user'] };
    }
  }
  return OrdersController;
}

const TenantOrdersController = ordersController('tenant-orders', JwtLikeGuard);

type TemplateUser = { tenantId?: unknown; id?: unknown; sub?: unknown } | undefined;
const userOf = (ctx: ExecutionContext) => ctx.switchToHttp().getRequest<{ user?: TemplateUser }>().user;

describe.each<Adapter>(['express', 'fastify'])('a getUser template over a missing field (%s)', (adapter) => {
  let a: EdgeApp;
  beforeAll(async () => {
    a = await makeApp(adapter, [TenantOrdersController], {
      getUser: (ctx) => `${userOf(ctx)?.tenantId}:${userOf(ctx)?.id}`,
    });
  });
  afterAll(async () => a?.close());

  it('refuses every such user 500 IDEMPOTENCY_USER_UNRESOLVED: bob never gets alice\'s answer, nothing runs', async () => {
    const errors = jest.spyOn(Logger.prototype, 'error').mockImplementation(() => undefined);
    orders = 0;
    const orderNo = randomUUID();
    const alice = await send(a.url, '/tenant-orders', { body: { orderNo }, headers: { 'x-user': 'alice' } });
    const bob = await send(a.url, '/tenant-orders', { body: { orderNo }, headers: { 'x-user': 'bob' } });
    const anonymous = await send(a.url, '/tenant-orders', { body: { orderNo } });
    // Observed before: alice 201, bob 201 replayed with alice's body, 1 run.
    expect({ statuses: [alice.status, bob.status, anonymous.status], bob: bob.text.includes('alice'), orders }).toEqual({
      statuses: [500, 500, 500],
      bob: false,
      orders: 0,
    });
    expect(JSON.parse(bob.text).code).toBe('IDEMPOTENCY_USER_UNRESOLVED');
    // Said of the app's getUser, not of the default one it replaced (an adversarial helper: the
    // log named request.user.id and asked for a getUser option the app had given).
    const said = errors.mock.calls.map(([message]) => String(message)).filter((message) => message.includes('no usable id'));
    errors.mockRestore();
    expect(said).toHaveLength(1);
    expect(said[0]).toMatch(/getUser gave no usable id/);
    expect(said[0]).not.toMatch(/request\.user\.id|Give the module a getUser option/);
  });
});

// The mechanism behind the recipe: getUser gives the parts ([tenantId, sub]) and the guard checks
// and joins them, so a missing part refuses the call, whatever the template would have written,
// and one sub in two tenants is two users. Before, a list was no user id: every call 500.
const TENANT_USERS: Record<string, unknown> = {
  alice: { sub: 'u-1', tenantId: 't1' },
  bob: { sub: 'u-1', tenantId: 't2' }, // the same sub as alice, in another tenant
  carol: { sub: 'u-carol' }, // no tenant
  dan: { sub: '', tenantId: 't1' }, // an empty sub
};

const TenantPartsController = ordersController('tenant-parts', loginFrom(TENANT_USERS));

describe.each<Adapter>(['express', 'fastify'])('a getUser giving the parts of a user (%s)', (adapter) => {
  let a: EdgeApp;
  beforeAll(async () => {
    a = await makeApp(adapter, [TenantPartsController], {
      getUser: (ctx) => [userOf(ctx)?.tenantId as string | undefined, userOf(ctx)?.sub as string | undefined],
    });
  });
  afterAll(async () => a?.close());

  it('keys one sub in two tenants as two users, and replays each its own answer', async () => {
    orders = 0;
    const orderNo = randomUUID();
    const [alice, bob] = await Promise.all(
      ['alice', 'bob'].map((user) => send(a.url, '/tenant-parts', { body: { orderNo }, headers: { 'x-user': user } })),
    );
    const [aliceAgain, bobAgain] = await Promise.all(
      ['alice', 'bob'].map((user) => send(a.url, '/tenant-parts', { body: { orderNo }, headers: { 'x-user': user } })),
    );
    expect({
      statuses: [alice.status, bob.status, aliceAgain.status, bobAgain.status],
      bodies: [alice.text, bob.text, aliceAgain.text, bobAgain.text].map((text) => JSON.parse(text).orderOf),
      replayed: [replayed(aliceAgain), replayed(bobAgain)],
      orders,
    }).toEqual({ statuses: [201, 201, 201, 201], bodies: ['alice', 'bob', 'alice', 'bob'], replayed: [true, true], orders: 2 });
  });

  // The review of session 21: a call without a user gave [undefined, undefined], and every
  // anonymous call was refused 500.
  it('keys a call without a user as anonymous (parts all missing): by the key it sent', async () => {
    orders = 0;
    const orderNo = randomUUID();
    const first = await send(a.url, '/tenant-parts', { body: { orderNo } });
    const again = await send(a.url, '/tenant-parts', { body: { orderNo } });
    expect({ statuses: [first.status, again.status], replayed: replayed(again), orders }).toEqual({ statuses: [201, 201], replayed: true, orders: 1 });
  });

  it('refuses a user with a missing or empty part 500 IDEMPOTENCY_USER_UNRESOLVED, and runs nothing', async () => {
    orders = 0;
    const orderNo = randomUUID();
    const answers = await Promise.all(
      ['carol', 'dan'].map((user) => send(a.url, '/tenant-parts', { body: { orderNo }, headers: { 'x-user': user } })),
    );
    expect({ statuses: answers.map((r) => r.status), codes: answers.map((r) => JSON.parse(r.text).code), orders }).toEqual({
      statuses: [500, 500],
      codes: ['IDEMPOTENCY_USER_UNRESOLVED', 'IDEMPOTENCY_USER_UNRESOLVED'],
      orders: 0,
    });
  });
});

describe('userOfId', () => {
  it.each<[unknown, unknown]>([
    [['t1', 'u-1'], { parts: ['t1', 'u-1'] }],
    [['t1', 42, 7n], { parts: ['t1', '42', '7'] }],
    [['u-1'], { id: 'u-1' }],
    ['t1,u-1', { id: 't1,u-1' }],
    [[], undefined],
    [['t1', undefined], undefined],
    [['t1', null], undefined],
    [['t1', ''], undefined],
    [['t1', Number.NaN], undefined],
    // helper-238: users whose numeric ids past 2^53 JSON parsing rounded to one were one user.
    [['t1', 1234567890123456037], undefined],
    [1234567890123456037, undefined],
    [['t1', 9007199254740991], { parts: ['t1', '9007199254740991'] }],
    [['t1', { id: 1 }], undefined],
    [['t1', ['u-1']], undefined],
    [['t1', 'undefined'], undefined],
    [['t1', ' '], undefined],
    [['t1', 'NaN'], undefined],
    [['t1', '[object Object]'], undefined],
    [Array.from({ length: 9 }, (_, i) => `p${i}`), undefined],
    // A part is a value as its field holds it: not searched for a template's words.
    [['t1', 'nan_li@acme.io'], { parts: ['t1', 'nan_li@acme.io'] }],
    [['null_gmail.com#EXT#@contoso.onmicrosoft.com'], { id: 'null_gmail.com#EXT#@contoso.onmicrosoft.com' }],
    [['t1', 'Nan'], { parts: ['t1', 'Nan'] }],
  ])('%p is %p', (id, expected) => expect(userOfId(id)).toEqual(expected));
});

// A fourth round: `[tenant, id].join()` over a missing id writes `t1,` (join writes null and
// undefined as empty), which passed, and bob got alice's answer; and real emails with `nan_` or
// `null_` in them (`nan_li@acme.io`, an Azure guest's `null_gmail.com#EXT#@...`) were refused 500 on
// every call. Text the user object holds, as a part of the id, is the user's data, not a
// template's filler; an id that is such text whole is given as a part ([user.id]). A fifth round:
// the text the id was read from vouched for itself, so a template's output that Passport's
// validate() stored as user.id (`t1:undefined`) merged users again.
const JOIN_USERS: Record<string, unknown> = {
  alice: { tenant: 't1', id: null, name: 'alice' },
  bob: { tenant: 't1', id: null, name: 'bob' },
  'alice-stored': { tenant: 't1', id: 't1:undefined', name: 'alice' },
  'bob-stored': { tenant: 't1', id: 't1:undefined', name: 'bob' },
  nan: { tenant: 't1', id: 'nan_li@acme.io', name: 'Nan Li' },
  guest: { tenant: 't1', id: 'null_gmail.com#EXT#@contoso.onmicrosoft.com', name: 'guest' },
  // Session 22: people named Nan (a common given name), read by the default lookup, were refused
  // 500 on every call; a template's output stored beside the tenant it was made of still is not a user.
  'li-nan': { id: 'li_nan', name: 'Li Nan' },
  'zhang-nan': { sub: 'zhang-nan' },
  'alice-t1-null': { tenant: 't1', id: 't1_null', name: 'alice' },
  'bob-t1-null': { tenant: 't1', id: 't1_null', name: 'bob' },
};

const JoinedOrdersController = ordersController('joined-orders', loginFrom(JOIN_USERS));

type JoinUser = { tenant?: string; id?: string | null };
const joinUserOf = (ctx: ExecutionContext) => ctx.switchToHttp().getRequest<{ user?: JoinUser }>().user;

describe.each<Adapter>(['express', 'fastify'])('a getUser joining parts, and ids with such words in them (%s)', (adapter) => {
  let joined: EdgeApp;
  let plain: EdgeApp;
  let parted: EdgeApp;
  beforeAll(async () => {
    joined = await makeApp(adapter, [JoinedOrdersController], {
      getUser: (ctx) => [joinUserOf(ctx)?.tenant, joinUserOf(ctx)?.id].join(),
    });
    plain = await makeApp(adapter, [JoinedOrdersController]); // the default: request.user.id
    parted = await makeApp(adapter, [JoinedOrdersController], { getUser: (ctx) => [joinUserOf(ctx)?.id as string] });
  });
  afterAll(async () => Promise.all([joined?.close(), plain?.close(), parted?.close()]));

  it("refuses `t1,` (an id join() wrote empty) 500: bob never gets alice's answer", async () => {
    orders = 0;
    const orderNo = randomUUID();
    const alice = await send(joined.url, '/joined-orders', { body: { orderNo }, headers: { 'x-user': 'alice' } });
    const bob = await send(joined.url, '/joined-orders', { body: { orderNo }, headers: { 'x-user': 'bob' } });
    // Observed before: alice 201, bob 201 replayed with alice's body, 1 run.
    expect({ statuses: [alice.status, bob.status], bob: bob.text.includes('alice'), orders }).toEqual({
      statuses: [500, 500],
      bob: false,
      orders: 0,
    });
  });

  it("refuses a template's output stored as request.user.id (t1:undefined) 500: it does not vouch for itself", async () => {
    orders = 0;
    const orderNo = randomUUID();
    const alice = await send(plain.url, '/joined-orders', { body: { orderNo }, headers: { 'x-user': 'alice-stored' } });
    const bob = await send(plain.url, '/joined-orders', { body: { orderNo }, headers: { 'x-user': 'bob-stored' } });
    // Observed before: alice 201, bob 201 replayed with alice's body, 1 run.
    expect({ statuses: [alice.status, bob.status], codes: [codeOf(alice), codeOf(bob)], orders }).toEqual({
      statuses: [500, 500],
      codes: ['IDEMPOTENCY_USER_UNRESOLVED', 'IDEMPOTENCY_USER_UNRESOLVED'],
      orders: 0,
    });
  });

  it('keys users whose id holds nan_ or null_ (an email, an Azure guest): whole, as a part of a join, or as a part', async () => {
    for (const app of [plain, joined, parted]) {
      orders = 0;
      const orderNo = randomUUID();
      const firsts = await Promise.all(['nan', 'guest'].map((user) => send(app.url, '/joined-orders', { body: { orderNo }, headers: { 'x-user': user } })));
      const again = await send(app.url, '/joined-orders', { body: { orderNo }, headers: { 'x-user': 'nan' } });
      // Observed before: 500 IDEMPOTENCY_USER_UNRESOLVED on every call.
      expect({ statuses: [...firsts, again].map((r) => r.status), again: [replayed(again), JSON.parse(again.text).orderOf], orders }).toEqual({
        statuses: [201, 201, 201],
        again: [true, 'nan'],
        orders: 2,
      });
    }
  });
  it('keys people whose id, read by the default lookup, ends with a word for nothing (li_nan); not a template beside its field (t1_null)', async () => {
    orders = 0;
    const orderNo = randomUUID();
    const people = await Promise.all(['li-nan', 'zhang-nan'].map((user) => send(plain.url, '/joined-orders', { body: { orderNo }, headers: { 'x-user': user } })));
    const again = await send(plain.url, '/joined-orders', { body: { orderNo }, headers: { 'x-user': 'zhang-nan' } });
    const stored = [];
    for (const user of ['alice-t1-null', 'bob-t1-null']) stored.push(await send(plain.url, '/joined-orders', { body: { orderNo }, headers: { 'x-user': user } }));
    // Observed before: li_nan and zhang-nan 500 IDEMPOTENCY_USER_UNRESOLVED on every call.
    expect({
      people: [...people, again].map((r) => r.status),
      again: [replayed(again), JSON.parse(again.text).orderOf],
      stored: stored.map(codeOf),
      orders,
    }).toEqual({
      people: [201, 201, 201],
      again: [true, 'zhang-nan'],
      stored: ['IDEMPOTENCY_USER_UNRESOLVED', 'IDEMPOTENCY_USER_UNRESOLVED'],
      orders: 2,
    });
  });
});

describe('idText', () => {
  it.each<[string, unknown]>([
    ['t1:undefined', undefined],
    ['undefined', undefined],
    ['undefined:undefined', undefined],
    ['t1_NaN', undefined],
    ['[object Object]', undefined],
    ['t1:[object Object]', undefined],
    // A second helper's round: other separators, none, upper case, null, an empty part.
    ['t1_undefined', undefined],
    ['t1undefined', undefined],
    ['T1:UNDEFINED', undefined],
    ['t1:null', undefined],
    ['t1_null', undefined],
    ['null', undefined],
    ['t1:', undefined],
    [':42', undefined],
    ['t1|NaN', undefined],
    // A fourth round: more separators, join()'s empty parts, other words for nothing.
    ['t1,', undefined],
    [',42', undefined],
    [',', undefined],
    ['t1#', undefined],
    ['t1/null', undefined],
    ['t1-null', undefined],
    ['t1.null', undefined],
    ['t1-NaN', undefined],
    ['t1 null', undefined],
    ['None', undefined],
    ['t1:nil', undefined],
    ['t1:(null)', undefined],
    ['{}', undefined],
    ['[]', undefined],
    ['Invalid Date', undefined],
    ['false', undefined],
    ['Symbol()', undefined],
    ['null ', undefined],
    [' :42', undefined],
    // Real ids, accepted without a user object to hold them.
    ['t1:u-alice', 't1:u-alice'],
    ['NaNa', 'NaNa'],
    ['null@example.com', 'null@example.com'],
    ['dev.null@acme.io', 'dev.null@acme.io'],
    ['ann.undefinedson@x.io', 'ann.undefinedson@x.io'],
    ['/x9AbcD+e==', '/x9AbcD+e=='],
    ['x9AbcD+e/', 'x9AbcD+e/'],
    ['#42', '#42'],
    ['https://id.example.com/users/42/', 'https://id.example.com/users/42/'],
    ['annulled', 'annulled'],
    ['nullable-1', 'nullable-1'],
    ['dXNlcjE=', 'dXNlcjE='],
    ['user_42', 'user_42'],
    ['auth0|abc123', 'auth0|abc123'],
    ['google-oauth2|1234567890', 'google-oauth2|1234567890'],
    ['01HZX3K4T5V6W7X8Y9Z0ABCDEF', '01HZX3K4T5V6W7X8Y9Z0ABCDEF'],
    ['undefinedBehaviour', 'undefinedBehaviour'],
  ])('%p is %p', (id, expected) => expect(idText(id)).toBe(expected));

  // Text the request's user object holds, as a part of the id, is the user's, not a template's
  // (a fourth round: real emails and names were refused 500 on every call). Never the text the
  // id was read from (a fifth round: it vouched for itself).
  it.each<[string, object, string | undefined]>([
    ['t1:nan_li@acme.io', { tenant: 't1', email: 'nan_li@acme.io' }, 't1:nan_li@acme.io'],
    ['t1,null_gmail.com#EXT#@contoso.onmicrosoft.com', { upn: 'null_gmail.com#EXT#@contoso.onmicrosoft.com' }, 't1,null_gmail.com#EXT#@contoso.onmicrosoft.com'],
    ['acme:Nan', { org: 'acme', profile: { first: 'Nan' } }, 'acme:Nan'],
    ['t1:NaN-team', { tenant: 't1', name: 'NaN-team' }, 't1:NaN-team'],
    // Held only as the whole id: where it was read, or a template's output stored.
    ['nan_li@acme.io', { sub: 'nan_li@acme.io' }, 'nan_li@acme.io'], // first, before `_`: a person
    ['t1:undefined', { id: 't1:undefined', name: 'alice' }, undefined],
    ['t1,', { id: 't1,', tenant: 't1' }, undefined],
    ['null:null', { id: 'null:null' }, undefined],
    ['t1 NULL', { tenant: 't1', name: 't1 NULL' }, undefined],
    // Held elsewhere in the id, or only as a bare word, is not held.
    ['t1_null', { tenant: 't1', name: 'Nullah' }, undefined],
    ['t1:null', { tenant: 't1', middle: 'null' }, undefined],
    ['acme:NaN', { org: 'acme', first: 'Nan' }, undefined], // held as Nan, written NaN: String(NaN)
    ['t1:undefined', { tenant: 't1', sub: 'u-1' }, undefined],
    ['t1,', { tenant: 't1', id: null }, undefined],
    ['nan_li@acme.io:undefined', { email: 'nan_li@acme.io' }, undefined],
    // A sixth round: an empty middle part, a stored template wrapped, a field and a lone
    // separator (join('-') over a missing field); real ids that end with a separator.
    ['t1::eu', { tenant: 't1', region: 'eu' }, undefined],
    ['api:t1:undefined', { id: 't1:undefined' }, undefined],
    ['t1:undefined@eu', { id: 't1:undefined', region: 'eu' }, undefined],
    ['t1-', { tenantId: 't1', sub: 'alice' }, undefined],
    ['t1/', { tenantId: 't1', sub: 'alice' }, undefined],
    ['-t1', { tenantId: 't1', sub: 'alice' }, undefined],
    ['V1StGXR8_', { sub: 'V1StGXR8_' }, 'V1StGXR8_'],
    ['V1StGXR8-Nil_dHi6B', { sub: 'V1StGXR8-Nil_dHi6B' }, 'V1StGXR8-Nil_dHi6B'],
    ['nan.chen@acme.io', { sub: 'nan.chen@acme.io' }, 'nan.chen@acme.io'],
    ['nil.armstrong', { sub: 'nil.armstrong' }, 'nil.armstrong'],
    ['NaN-team', { name: 'NaN-team' }, 'NaN-team'],
    ['jean-none', { sub: 'jean-none' }, undefined], // last after '-': a template's last field
    // A seventh round: a numeric field, an empty field after several, doubled separators, a
    // nothing-word in the middle, `@` with the name missing.
    ['7-', { tenantId: 7, sub: 'alice' }, undefined],
    ['-7', { tenantId: 7, sub: 'alice' }, undefined],
    ['eu-t1-', { region: 'eu', tenantId: 't1' }, undefined],
    ['eu.t1.', { region: 'eu', tenantId: 't1' }, undefined],
    ['t1--eu', { tenantId: 't1', region: 'eu' }, undefined],
    ['t1__eu', { tenantId: 't1', region: 'eu' }, undefined],
    ['t1-null-eu', { tenantId: 't1', region: 'eu' }, undefined],
    ['@acme', { realm: 'acme', sub: 'x' }, undefined],
    ['t1@', { tenantId: 't1' }, undefined],
    ['V1S--Xy9_', { sub: 'V1S--Xy9_', iat: 1712345678 }, 'V1S--Xy9_'],
    ['wang.nan.li@acme.io', { sub: 'wang.nan.li@acme.io' }, 'wang.nan.li@acme.io'],
    // An eighth round: `//` doubled, a one-character field, JSON of a missing field.
    ['t1//eu', { tenantId: 't1', region: 'eu' }, undefined],
    ['1-', { tenantId: '1', sub: 'alice' }, undefined],
    ['["t1",null]', { tenantId: 't1' }, undefined],
    ['{"tenantId":"t1","userId":null}', { tenantId: 't1' }, undefined],
    ['https://id.example.com/users/42', { sub: 'https://id.example.com/users/42', iss: 'https://id.example.com/' }, 'https://id.example.com/users/42'],
  ])('%p with user %j is %p', (id, user, expected) => expect(idText(id, () => user)).toBe(expected));

  // Session 22: an id read as the user's field holds it (the default lookup) is the user's where
  // the word follows `_-./` or a space with no field of the user beside it: people named Nan.
  // Between `:|#,;`, or beside a field the user holds, it is still a template's output stored.
  it.each<[string, object, string | undefined, string | undefined]>([
    ['li_nan', { id: 'li_nan' }, 'li_nan', undefined],
    ['zhang-nan', { sub: 'zhang-nan' }, 'zhang-nan', undefined],
    ['wang.nan', { id: 'wang.nan', name: 'Wang Nan' }, 'wang.nan', undefined],
    ['Li_Nan', { id: 'Li_Nan' }, 'Li_Nan', undefined],
    ['li-nan-88', { id: 'li-nan-88' }, 'li-nan-88', undefined],
    ['mr-nil', { id: 'mr-nil' }, 'mr-nil', undefined],
    // The word as a template writes it, even with no field beside it (the review: `${org}-${uid}`).
    ['acme-null', { id: 'acme-null', email: 'a@b.c' }, undefined, undefined],
    ['dev-null', { id: 'dev-null' }, undefined, undefined],
    ['acme_NaN', { id: 'acme_NaN' }, undefined, undefined],
    ['acme.None', { id: 'acme.None' }, undefined, undefined],
    ['t1_null', { id: 't1_null', tenant: 't1' }, undefined, undefined],
    ['t1-null-eu', { id: 't1-null-eu', region: 'eu' }, undefined, undefined],
    ['eu_t1_null', { id: 'eu_t1_null', tenantId: 't1' }, undefined, undefined],
    ['7-NaN', { id: '7-NaN', tenantId: 7 }, undefined, undefined],
    ['t1:null', { id: 't1:null' }, undefined, undefined],
    ['["li",null]', { id: '["li",null]' }, undefined, undefined],
    ['li_nan:undefined', { id: 'li_nan:undefined' }, undefined, undefined],
  ])('%p with user %j is %p read as a field, %p from a getUser', (id, user, asField, asTemplate) => {
    expect([idText(id, () => user, 'field'), idText(id, () => user)]).toEqual([asField, asTemplate]);
  });
});
