import { describe, it, expect } from '@jest/globals';
import { IdempotencyConfigError, IdempotencyKeyError } from '../errors/idempotency.errors.js';
import { describeKeyPath, evaluateKeyPath, parseKeyExpression, type KeySources } from './key-expression.js';

const WHERE = 'OrdersController.create';
const evaluate = (expr: string, sources: KeySources) => evaluateKeyPath(parseKeyExpression(expr, WHERE), sources);

describe('parseKeyExpression', () => {
  it.each([
    ['#body.orderNo', 'body', ['orderNo']],
    ['#req.orderNo', 'body', ['orderNo']],
    ['#body', 'body', []],
    ['#data.items[0].sku', 'data', ['items', '0', 'sku']],
    ["#headers['X-Request-Id']", 'headers', ['x-request-id']],
    ['#headers["x-request-id"]', 'headers', ['x-request-id']],
    ['#headers.Authorization', 'headers', ['authorization']],
    ['#query.ref', 'query', ['ref']],
    ['#params.id', 'params', ['id']],
    ['#user.tenant.$id_2', 'user', ['tenant', '$id_2']],
    ["#body['a.b']['c]d'][12]", 'body', ['a.b', 'c]d', '12']],
    ["#body['it\\'s']", 'body', ["it's"]],
    ['#body["back\\\\slash \\"q\\""]', 'body', ['back\\slash "q"']],
    ["#body['']", 'body', ['']],
  ])('parses %s', (expr, root, segments) => {
    const path = parseKeyExpression(expr, WHERE);
    expect(path.root).toBe(root);
    expect(path.segments).toEqual(segments);
    expect(path.expression).toBe(expr);
  });

  it('keeps the case of non-header segments', () => {
    expect(parseKeyExpression('#body.OrderNo', WHERE).segments).toEqual(['OrderNo']);
  });

  it.each([
    ['', /empty/],
    ['body.orderNo', /must start with "#"/],
    ['#', /expected a root/],
    ['#request.orderNo', /unknown root "#request"/],
    ['#Body.orderNo', /unknown root/],
    ['#body.', /expected a property name/],
    ['#body..a', /expected a property name/],
    ['#body.1a', /expected a property name/],
    ['#body.a-b', /unexpected "-"/],
    ['#headers.x-request-id', /unexpected "-"/],
    ['#body[', /expected a quoted name or a non-negative integer/],
    ['#body[abc]', /expected a quoted name or a non-negative integer/],
    ['#body[-1]', /expected a quoted name or a non-negative integer/],
    ['#body[01]', /expected a quoted name or a non-negative integer/],
    ['#body[1', /expected a quoted name or a non-negative integer/],
    ["#body['a'", /expected "\]"/],
    ["#body['a", /unterminated string/],
    ['#body["a\']', /unterminated string/],
    ["#body['a\\n']", /unsupported escape/],
    ['#body.a ', /unexpected " "/],
    [' #body.a', /must start with "#"/],
    ['#body.a]', /unexpected "\]"/],
    ['#body.a()', /unexpected "\("/],
    ['#body.__proto__', /"__proto__" may not be used/],
    ["#user['constructor']", /"constructor" may not be used/],
    ['#body.a.prototype', /"prototype" may not be used/],
  ])('rejects %j', (expr, reason) => {
    const parse = () => parseKeyExpression(expr, WHERE);
    expect(parse).toThrow(IdempotencyConfigError);
    expect(parse).toThrow(reason);
    expect(parse).toThrow(WHERE);
    expect(parse).toThrow(JSON.stringify(expr));
  });
});

describe('describeKeyPath', () => {
  it.each([
    ['#body.orderNo', 'the body field "orderNo"'],
    ['#body.order.items[0]', 'the body field "order.items.0"'],
    ['#body', 'the request body'],
    ["#headers['X-Request-Id']", 'the x-request-id header'],
    ['#query.ref', 'the query parameter "ref"'],
    ['#params.id', 'the path parameter "id"'],
    ['#user.tenantId', 'the user\'s "tenantId"'],
    ['#data.messageId', 'the message field "messageId"'],
  ])('names %s in the client\'s words', (expr, words) => expect(describeKeyPath(parseKeyExpression(expr, WHERE))).toBe(words));
});

describe('evaluateKeyPath', () => {
  it('reads nested body, data, query, params and user values', () => {
    expect(evaluate('#body.order.no', { body: { order: { no: 'A-1' } } })).toBe('A-1');
    expect(evaluate('#req.orderNo', { body: { orderNo: 'legacy' } })).toBe('legacy');
    expect(evaluate('#data.items[1].sku', { data: { items: [{ sku: 'a' }, { sku: 'b' }] } })).toBe('b');
    expect(evaluate('#query.ref', { query: { ref: 'r1' } })).toBe('r1');
    expect(evaluate('#params.id', { params: { id: '42' } })).toBe('42');
    expect(evaluate('#user.tenant.id', { user: { tenant: { id: 7 } } })).toBe('7');
  });

  it('reads the whole body when it is a primitive', () => {
    expect(evaluate('#body', { body: 'abc' })).toBe('abc');
    expect(evaluate('#body', { body: 12 })).toBe('12');
    expect(() => evaluate('#body', { body: { a: 1 } })).toThrow(IdempotencyKeyError);
  });

  it('matches header names case-insensitively and refuses repeated headers', () => {
    const headers = { 'x-request-id': 'req-1', 'x-dup': ['a', 'b'] };
    expect(evaluate("#headers['X-Request-ID']", { headers })).toBe('req-1');
    expect(() => evaluate('#headers["x-dup"]', { headers })).toThrow('the x-dup header is a list (was it sent more than once?), not one value');
    expect(evaluate('#headers["x-none"]', { headers })).toBeUndefined();
  });

  it.each([
    ['string', 'x', 'x'],
    ['empty string', '', ''],
    ['integer', 5, '5'],
    ['float', 1.5, '1.5'],
    ['bigint', 12345678901234567890n, '12345678901234567890'],
    ['true', true, 'true'],
    ['false', false, 'false'],
    ['null', null, undefined],
    ['undefined', undefined, undefined],
  ])('converts a %s', (_name, value, expected) => {
    expect(evaluate('#body.k', { body: { k: value } })).toBe(expected);
  });

  // Taken for no key, a route with `required: false` ran every such call unguarded.
  it.each([
    ['NaN', NaN, 'NaN'],
    ['Infinity', Infinity, 'Infinity'],
    // helper-238: JSON.parse rounds an integer past 2^53 (a snowflake id sent as a number): ids
    // 37 apart were one key, and the second operation was answered the first's replay.
    ['integer past 2^53', 1234567890123456037, '1234567890123456000, an integer past 2^53 that a double does not hold exactly (send it as a string)'],
    ['object', { a: 1 }, 'an object'],
    ['array', ['a', 'a'], 'a list (was it sent more than once?)'],
    ['function', () => 'k', 'a function'],
  ])('refuses a %s as no one key, naming where it was found', (_name, value, kind) => {
    expect(() => evaluate('#query.k', { query: { k: value } })).toThrow(
      new IdempotencyKeyError(`the query parameter "k" is ${kind}, not one value`),
    );
  });

  it('returns undefined for missing sources and paths through null or undefined', () => {
    expect(evaluate('#body.a', {})).toBeUndefined();
    expect(evaluate('#user.id', { user: undefined })).toBeUndefined();
    expect(evaluate('#body.a.b', { body: { a: null } })).toBeUndefined();
    expect(evaluate('#body.a.b', { body: undefined })).toBeUndefined();
  });

  // An adversarial helper (session 20): taken for no key, a route with `required: false` ran
  // every such call unguarded.
  it.each([
    ['#body.a.b', { body: { a: 'str' } }, 'the body field "a.b" cannot be read: what holds it is a text'],
    ['#body.a.length', { body: { a: 'str' } }, 'the body field "a.length" cannot be read: what holds it is a text'],
    ['#body.order.no', { body: { order: ['A1'] } }, 'the body field "order.no" cannot be read: what holds it is a list (was it sent more than once?)'],
    ['#body.orderNo', { body: '{"orderNo":"A1"}' }, 'the body field "orderNo" cannot be read: what holds it is a text'],
    ['#body.orderNo', { body: [{ orderNo: 'A1' }] }, 'the body field "orderNo" cannot be read: what holds it is a list (was it sent more than once?)'],
  ])('refuses %s through a primitive or a list: %p', (expr, sources, problem) => {
    expect(() => evaluate(expr, sources as KeySources)).toThrow(new IdempotencyKeyError(problem));
  });

  it('walks into a list by an index', () => {
    expect(evaluate('#data.items[1].sku', { data: { items: [{ sku: 'a' }, { sku: 'b' }] } })).toBe('b');
    expect(evaluate('#data.items[5].sku', { data: { items: [] } })).toBeUndefined();
  });

  it('walks own properties only', () => {
    const proto = { secret: 'inherited' };
    const body = Object.create(proto) as Record<string, unknown>;
    expect(evaluate('#body.secret', { body })).toBeUndefined();
    expect(evaluate('#body.toString', { body: {} })).toBeUndefined();
    expect(evaluate('#body.hasOwnProperty', { body: {} })).toBeUndefined();
  });

  it('never walks into __proto__, constructor or prototype, even when they are own properties', () => {
    const body = JSON.parse('{"__proto__": {"k": "polluted"}, "constructor": "c"}') as unknown;
    const forged = { root: 'body', segments: ['__proto__', 'k'], expression: 'forged' } as const;
    expect(evaluateKeyPath(forged, { body })).toBeUndefined();
    const ctor = { root: 'body', segments: ['constructor'], expression: 'forged' } as const;
    expect(evaluateKeyPath(ctor, { body })).toBeUndefined();
    expect(({} as Record<string, unknown>).k).toBeUndefined();
  });

  it('works on objects without a prototype (Node header objects)', () => {
    const headers = Object.assign(Object.create(null) as Record<string, string>, { 'idem-key': 'k1' });
    expect(evaluate('#headers["Idem-Key"]', { headers })).toBe('k1');
  });
});
