import { describe, expect, it } from '@jest/globals';
import { sentMoreThanOnce } from './header-lines.js';
import { readKeyHeader } from './idempotency-key.js';
import { readRequestId } from './request-id.js';

// What Node gives for `Idempotency-Key: K` sent on two lines: one joined value in `headers`.
const node = { headers: { 'idempotency-key': 'K, K', 'x-request-id': 'r1, r1' }, headersDistinct: { 'idempotency-key': ['K', 'K'], 'x-request-id': ['r1', 'r1'] } };
const http2 = { headers: { 'idempotency-key': 'K, K' }, rawHeaders: [':method', 'POST', 'Idempotency-Key', 'K', 'idempotency-key', 'K'] };

describe('sentMoreThanOnce', () => {
  it('counts the lines in headersDistinct, a Fastify request\'s raw, HTTP/2\'s rawHeaders, else headers', () => {
    expect(sentMoreThanOnce(node, 'idempotency-key')).toBe(true);
    expect(sentMoreThanOnce({ headers: node.headers, raw: node } as never, 'idempotency-key')).toBe(true);
    expect(sentMoreThanOnce(http2, 'idempotency-key')).toBe(true);
    expect(sentMoreThanOnce({ ...http2, rawHeaders: ['Idempotency-Key', 'K, K'] }, 'idempotency-key')).toBe(false);
    expect(sentMoreThanOnce({ headers: { a: 'x, y' } }, 'a')).toBe(false);
    expect(sentMoreThanOnce({ headers: { a: ['x', 'y'] } }, 'a')).toBe(true);
    expect(sentMoreThanOnce(http2, 'absent')).toBe(false);
    // helper-216: an Express request an app gave a `raw` of its own was read as Fastify's.
    expect(sentMoreThanOnce({ ...node, raw: Buffer.from('body') } as never, 'idempotency-key')).toBe(true);
    expect(sentMoreThanOnce({ ...node, raw: undefined } as never, 'idempotency-key')).toBe(true);
  });
});

describe('readKeyHeader and readRequestId, given the request', () => {
  it('refuse a header sent on two lines, which request.headers shows as one key', () => {
    expect(readKeyHeader(node)).toEqual({ invalid: expect.stringMatching(/more than once/) });
    expect(readKeyHeader(http2, 'Idempotency-Key')).toEqual({ invalid: expect.stringMatching(/more than once/) });
    expect(readRequestId(node)).toEqual({ invalid: expect.stringMatching(/x-request-id.*more than once/) });
    // What they cannot tell from headers alone:
    expect(readRequestId(node.headers)).toEqual({ requestId: 'r1, r1' });
  });

  // helper-213: they read the lines as received, so a key a middleware set or rewrote in
  // request.headers (as the guard reads it) was missing, or the client's instead of the app's.
  it('read the value from request.headers, as the guard does, and the lines only to count them', () => {
    const mapped = { headers: { 'idempotency-key': 'tenant-7:op-1', 'x-request-id': 'op-1' }, headersDistinct: { 'x-idem': ['op-1'] } };
    expect(readKeyHeader(mapped)).toEqual({ key: 'tenant-7:op-1' });
    expect(readRequestId(mapped)).toEqual({ requestId: 'op-1' });
    const rewritten = { headers: { 'idempotency-key': 'tenant-7:op-1' }, headersDistinct: { 'idempotency-key': ['op-1'] } };
    expect(readKeyHeader(rewritten)).toEqual({ key: 'tenant-7:op-1' });
    // A comma on one line is one key.
    expect(readKeyHeader({ headers: { 'idempotency-key': 'a, b' }, headersDistinct: { 'idempotency-key': ['a, b'] } })).toEqual({ key: 'a, b' });
  });

  it('read one line as the guard does', () => {
    const one = { headers: { 'idempotency-key': '"K"' }, headersDistinct: { 'idempotency-key': ['"K"'] } };
    expect(readKeyHeader(one)).toEqual({ key: 'K' });
    expect(readKeyHeader({ headers: {}, headersDistinct: {} })).toBeUndefined();
    expect(readRequestId({ headers: { 'x-request-id': 'a' }, headersDistinct: { 'x-request-id': ['a'] } })).toEqual({ requestId: 'a' });
  });
});
