import { describe, expect, it } from '@jest/globals';
import { readRequestId } from './request-id.js';

describe('readRequestId', () => {
  it('reads X-Request-Id or X-Idempotency-Key, quoted or bare', () => {
    expect(readRequestId({})).toBeUndefined();
    expect(readRequestId({ 'x-request-id': 'abc' })).toEqual({ requestId: 'abc' });
    expect(readRequestId({ 'x-idempotency-key': '"abc"' })).toEqual({ requestId: 'abc' });
    expect(readRequestId({ 'x-request-id': 'abc', 'x-idempotency-key': '"abc"' })).toEqual({ requestId: 'abc' });
  });

  it('refuses an invalid id, and two headers that differ', () => {
    expect(readRequestId({ 'x-request-id': '' })).toEqual({ invalid: expect.stringContaining('x-request-id') });
    expect(readRequestId({ 'x-request-id': 'r'.repeat(256) })).toEqual({ invalid: expect.stringContaining('255') });
    expect(readRequestId({ 'x-request-id': 'a', 'x-idempotency-key': 'b' })).toEqual({ invalid: 'x-request-id and x-idempotency-key differ' });
  });

  // Node joins two bare values of one header into one ('a, b'), which reads as one id; its
  // request's headersDistinct keeps them apart.
  it('refuses a header sent twice, as headersDistinct gives it', () => {
    expect(readRequestId({ 'x-request-id': ['a', 'b'] })).toEqual({ invalid: expect.stringMatching(/x-request-id.*more than once/) });
    expect(readRequestId({ 'x-request-id': ['a'] })).toEqual({ requestId: 'a' });
  });

  it('reads the headers it is given', () => {
    expect(readRequestId({ 'idempotency-key': 'k' }, ['Idempotency-Key'])).toEqual({ requestId: 'k' });
  });
});
