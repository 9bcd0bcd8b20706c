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

  it('reads the headers it is given', () => {
    expect(readRequestId({ 'idempotency-key': 'k' }, ['Idempotency-Key'])).toEqual({ requestId: 'k' });
  });
});
