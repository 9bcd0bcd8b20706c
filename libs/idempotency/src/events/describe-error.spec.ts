import { describe, expect, it } from '@jest/globals';
import { inspect } from 'node:util';
import { IdempotencyStoreError } from '../errors/idempotency.errors.js';
import { describeStoreError, describeThrown } from './describe-error.js';

const KEY = 'p:anon::Signup.create:jane%40example.com';
const HASH = 'f'.repeat(64);

describe('describeThrown', () => {
  it.each<[string, () => unknown, RegExp]>([
    ['an Error', () => new Error('boom'), /^boom$/],
    ['a string', () => 'not an Error', /^not an Error$/],
    ['undefined', () => undefined, /^undefined$/],
    ['an object with no prototype', () => Object.assign(Object.create(null) as object, { code: 'E_AUDIT' }), /E_AUDIT/],
    ['a revoked Proxy', () => {
      const { proxy, revoke } = Proxy.revocable({}, {});
      revoke();
      return proxy;
    }, /cannot be described/],
    ['a message getter that throws', () => ({ get message(): string { throw new Error('trap'); } }), /cannot be described/],
  ])('describes %s without throwing', (_, thrown, message) => {
    expect(describeThrown(thrown()).message).toMatch(message);
  });
});

describe('describeStoreError', () => {
  it('keeps the name, the code (else the cause\'s) and the message with the storage key hashed; never the cause', () => {
    const cause = Object.assign(new Error('OOM command not allowed'), { code: 'OOM', command: { args: [KEY, 'token', '{"card":"4111"}'] } });
    const error = new IdempotencyStoreError(`Redis command failed on ${KEY}: ${cause.message}`, { cause });
    const described = describeStoreError(error, KEY, HASH);
    expect(described).toBeInstanceOf(Error);
    expect(described).toMatchObject({ name: 'IdempotencyStoreError', code: 'OOM', message: `Redis command failed on ${HASH}: OOM command not allowed` });
    expect(described.cause).toBeUndefined();
    expect(described.stack).toMatch(/^IdempotencyStoreError: Redis command failed on f+: OOM/);
    expect(described.stack).toMatch(/\n\s+at /);
    const written = inspect(described, { depth: 10 });
    expect(written).not.toContain('jane');
    expect(written).not.toContain('4111');
    expect(written).not.toContain('token');
  });

  it('describes what is not an Error, and never throws', () => {
    expect(describeStoreError('down', KEY, HASH)).toMatchObject({ name: 'Error', message: 'down' });
    expect(describeStoreError(null, KEY, HASH)).toBeInstanceOf(Error);
    expect(describeStoreError(Object.create(null), KEY, HASH)).toBeInstanceOf(Error);
  });
});
