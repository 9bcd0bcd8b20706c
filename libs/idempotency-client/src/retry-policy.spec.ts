import { describe, expect, it } from '@jest/globals';
import { backoffDelayMs, isRetryableAnswer, parseRetryAfterMs } from './retry-policy.js';

describe('backoffDelayMs', () => {
  const backoff = { baseMs: 100, maxMs: 1000, jitter: 0 };

  it('doubles from baseMs up to maxMs', () => {
    expect([1, 2, 3, 4, 5, 6].map((retry) => backoffDelayMs(retry, backoff))).toEqual([100, 200, 400, 800, 1000, 1000]);
  });

  it('takes the jitter share off at random: full jitter spans 0 to the delay, half jitter the upper half', () => {
    expect(backoffDelayMs(3, { ...backoff, jitter: 1 }, () => 0)).toBe(400);
    expect(backoffDelayMs(3, { ...backoff, jitter: 1 }, () => 0.999)).toBe(0);
    expect(backoffDelayMs(3, { ...backoff, jitter: 0.5 }, () => 0.999)).toBe(200);
  });
});

describe('parseRetryAfterMs', () => {
  it('reads delay-seconds and HTTP dates', () => {
    expect(parseRetryAfterMs('2')).toBe(2000);
    expect(parseRetryAfterMs(' 0 ')).toBe(0);
    const now = Date.parse('2026-01-01T00:00:00Z');
    expect(parseRetryAfterMs('Thu, 01 Jan 2026 00:00:03 GMT', now)).toBe(3000);
    expect(parseRetryAfterMs('Wed, 31 Dec 2025 23:59:00 GMT', now)).toBe(0);
  });

  it('is undefined when absent or unreadable', () => {
    expect(parseRetryAfterMs(null)).toBeUndefined();
    expect(parseRetryAfterMs('soon')).toBeUndefined();
    expect(parseRetryAfterMs('-1')).toBeUndefined();
    expect(parseRetryAfterMs('1.5')).toBeUndefined();
  });
});

describe('isRetryableAnswer', () => {
  it.each([
    [500, null, undefined, true],
    [502, null, undefined, true],
    [503, '1', { code: 'IDEMPOTENCY_STORE_UNAVAILABLE' }, true],
    [500, null, { code: 'IDEMPOTENCY_USER_UNRESOLVED' }, false],
    [409, '1', { code: 'IDEMPOTENCY_IN_PROGRESS' }, true],
    [409, null, { code: 'IDEMPOTENCY_IN_PROGRESS' }, true],
    [409, '1', undefined, true],
    [409, null, { code: 'ORDER_EXISTS' }, false],
    [409, null, { code: 'IDEMPOTENCY_RESPONSE_NOT_REPLAYABLE' }, false],
    [400, null, { code: 'IDEMPOTENCY_KEY_MISSING' }, false],
    [422, null, { code: 'IDEMPOTENCY_KEY_REUSED' }, false],
    [408, null, { statusCode: 408, message: 'Request Timeout' }, true],
    [408, null, undefined, true],
    [429, '1', undefined, false],
    [201, null, {}, false],
  ])('status %i, Retry-After %p, body %p: %p', (status, retryAfter, body, expected) => {
    expect(isRetryableAnswer(status, retryAfter, body)).toBe(expected);
  });
});
