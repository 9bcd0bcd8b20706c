import { describe, expect, it } from '@jest/globals';
import { headerLines } from './header-lines.js';
import { readKeyHeader } from './idempotency-key.js';
import { readRequestId } from './request-id.js';

// What Node gives for `Idempotency-Key: K` sent on two lines: one joined value in `headers`.
const node = { headers: { 'idempotency-key': 'K, K', 'x-request-id': 'r1, r1' }, headersDistinct: { 'idempotency-key': ['K', 'K'], 'x-request-id': ['r1', 'r1'] } };
const http2 = { headers: { 'idempotency-key': 'K, K' }, rawHeaders: [':method', 'POST', 'Idempotency-Key', 'K', 'idempotency-key', 'K'] };

describe('headerLines', () => {
  it('reads the lines from headersDistinct, a Fastify request\'s raw, HTTP/2\'s rawHeaders, else headers', () => {
    expect(headerLines(node, 'idempotency-key')).toEqual(['K', 'K']);
    expect(headerLines({ headers: node.headers, raw: node } as never, 'idempotency-key')).toEqual(['K', 'K']);
    expect(headerLines(http2, 'idempotency-key')).toEqual(['K', 'K']);
    expect(headerLines({ headers: { a: 'x' } }, 'a')).toEqual(['x']);
    expect(headerLines(http2, 'absent')).toBeUndefined();
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

  it('read one line as the guard does', () => {
    const one = { headers: { 'idempotency-key': '"K"' }, headersDistinct: { 'idempotency-key': ['"K"'] } };
    expect(readKeyHeader(one)).toEqual({ key: 'K' });
    expect(readKeyHeader({ headers: {}, headersDistinct: {} })).toBeUndefined();
    expect(readRequestId({ headers: { 'x-request-id': 'a' }, headersDistinct: { 'x-request-id': ['a'] } })).toEqual({ requestId: 'a' });
  });
});
