// A key expression that finds a list or an object: a form field or a query parameter sent twice
// (`orderNo=A1&orderNo=A1`, `?ref=A1&ref=A1`, which the parsers give as lists) or an object
// (`{"orderNo":{"id":"A1"}}`). The guard took such a value for no key, so on a route with
// `required: false` every call ran unguarded (an adversarial helper: 5 identical calls, 5 runs),
// and a route that requires a key told the client to send what it had sent. It is refused 400
// `IDEMPOTENCY_KEY_INVALID`, as a key header sent twice is.
import { afterAll, beforeAll, describe, expect, it } from '@jest/globals';
import { Body, Controller, Post, Query } from '@nestjs/common';
import { NoRepeatSubmit } from '../libs/idempotency/src/index.js';
import { codeOf, makeApp, replayed, send, type Adapter, type EdgeApp, type RawOptions } from './support/edge-app.js';

const runs: string[] = [];

@Controller('orders')
class OrdersController {
  @Post()
  @NoRepeatSubmit({ required: false, idempotentKey: '#body.orderNo' })
  create(@Body() body: { orderNo?: unknown }) {
    runs.push(`create ${JSON.stringify(body.orderNo)}`);
    return { run: runs.length };
  }

  @Post('by-ref')
  @NoRepeatSubmit({ required: false, idempotentKey: '#query.ref' })
  byRef(@Query('ref') ref: unknown) {
    runs.push(`by-ref ${JSON.stringify(ref)}`);
    return { run: runs.length };
  }

  @Post('nested')
  @NoRepeatSubmit({ required: false, idempotentKey: '#body.order.no' })
  nested(@Body() body: unknown) {
    runs.push(`nested ${JSON.stringify(body)}`);
    return { run: runs.length };
  }

  @Post('by-header')
  @NoRepeatSubmit()
  byHeader() {
    runs.push('by-header');
    return { run: runs.length };
  }

  @Post('required')
  @NoRepeatSubmit({ idempotentKey: '#body.orderNo' })
  required(@Body() body: { orderNo?: unknown }) {
    runs.push(`required ${JSON.stringify(body.orderNo)}`);
    return { run: runs.length };
  }
}

const form = (text: string): RawOptions => ({ body: text, headers: { 'content-type': 'application/x-www-form-urlencoded' } });

describe.each<Adapter>(['express', 'fastify'])('a key expression that finds a list or an object (%s)', (adapter) => {
  let a: EdgeApp;
  beforeAll(async () => {
    a = await makeApp(adapter, [OrdersController]);
  });
  afterAll(async () => a?.close());

  it.each<[string, string, () => RawOptions, string]>([
    ['a form field sent twice', '/orders', () => form('orderNo=A1&orderNo=A1&amount=5'), 'the body field "orderNo" is a list'],
    ['a query parameter sent twice', '/orders/by-ref?ref=A1&ref=A1', () => ({}), 'the query parameter "ref" is a list'],
    ['an object', '/orders', () => ({ body: { orderNo: { id: 'A1' } } }), 'the body field "orderNo" is an object'],
    // A second helper's round: a path through a text or a list, and a body that is a list.
    ['a path through a text', '/orders/nested', () => ({ body: { order: 'A1' } }), 'the body field "order.no" cannot be read'],
    ['a path through a list', '/orders/nested', () => ({ body: { order: ['A1'] } }), 'the body field "order.no" cannot be read'],
    ['a body that is a list', '/orders', () => ({ body: [{ orderNo: 'A1' }] }), 'the body field "orderNo" cannot be read'],
  ])('is refused 400 IDEMPOTENCY_KEY_INVALID on a route that does not require a key: %s, 5 at once', async (_name, path, options, problem) => {
    runs.length = 0;
    const answers = await Promise.all(Array.from({ length: 5 }, () => send(a.url, path, options())));
    expect({ statuses: answers.map((x) => x.status), codes: answers.map(codeOf), runs }).toEqual({
      statuses: [400, 400, 400, 400, 400],
      codes: Array(5).fill('IDEMPOTENCY_KEY_INVALID'),
      runs: [],
    });
    expect((JSON.parse(answers[0]!.text) as { message: string }).message).toContain(problem);
  });

  // A third round: `Idempotency-Key: undefined` (a client's template over a key it never
  // made) and a key function's `c1:undefined` keyed every such call as one.
  it.each([
    ['a header key "undefined"', '/orders/by-header', { key: 'undefined' }],
    ['a header key "[object Object]"', '/orders/by-header', { key: '[object Object]' }],
    ['a body key "c1:undefined"', '/orders', { body: { orderNo: 'c1:undefined' } }],
    ['a body key "null"', '/orders', { body: { orderNo: 'null' } }],
    // A fourth round: whole keys a template writes for an object or a bad date.
    ['a header key "{}"', '/orders/by-header', { key: '{}' }],
    ['a header key "Invalid Date"', '/orders/by-header', { key: 'Invalid Date' }],
  ])('refuses %s 400 IDEMPOTENCY_KEY_INVALID, nothing runs', async (_name, path, options) => {
    runs.length = 0;
    const answer = await send(a.url, path, options);
    expect({ status: answer.status, code: codeOf(answer), runs }).toEqual({ status: 400, code: 'IDEMPOTENCY_KEY_INVALID', runs: [] });
  });

  // A fourth round: keys a client made with `nan` or `null` between underscores (a batch name,
  // a nanoid) were refused 400 on every call.
  it.each(['nan_batch_7', 'V1StGXR8_nan_dHi6B', 'order_null_42'])('takes the key %p, and replays it', async (key) => {
    runs.length = 0;
    const first = await send(a.url, '/orders/by-header', { key: `${key}-${adapter}` });
    const again = await send(a.url, '/orders/by-header', { key: `${key}-${adapter}` });
    expect({ statuses: [first.status, again.status], replayed: replayed(again), runs }).toEqual({
      statuses: [201, 201],
      replayed: true,
      runs: ['by-header'],
    });
  });

  it('is refused as invalid, not missing, on a route that requires a key', async () => {
    runs.length = 0;
    const answer = await send(a.url, '/orders/required', form('orderNo=A1&orderNo=A1'));
    expect({ status: answer.status, code: codeOf(answer), runs }).toEqual({ status: 400, code: 'IDEMPOTENCY_KEY_INVALID', runs: [] });
  });

  it('(control) one value is one key: 5 at once run once; null and no field are no key', async () => {
    runs.length = 0;
    const once = `B-${adapter}-${Date.now()}`;
    const answers = await Promise.all(Array.from({ length: 5 }, () => send(a.url, '/orders', form(`orderNo=${once}`))));
    expect(answers.filter((x) => x.status === 201 && !replayed(x))).toHaveLength(1);
    expect(runs).toEqual([`create "${once}"`]);
    runs.length = 0;
    expect((await send(a.url, '/orders', { body: { orderNo: null } })).status).toBe(201);
    expect((await send(a.url, '/orders/by-ref')).status).toBe(201);
    expect(runs).toHaveLength(2);
  });
});
