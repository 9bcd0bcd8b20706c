import { describe, expect, it } from '@jest/globals';
import { validateKey } from '../keys/idempotency-key.js';
import { longestClientKey } from './store-contract.js';

describe('the store contract', () => {
  it('uses the longest client key the guard accepts', () => {
    expect(validateKey(longestClientKey('\u{1F600}'))).toBeUndefined();
    expect(validateKey(longestClientKey('\u{1F600}') + '\u{1F600}')).toBeDefined();
  });
});
