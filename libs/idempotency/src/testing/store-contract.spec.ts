import { describe, expect, it } from '@jest/globals';
import { validateKey } from '../keys/idempotency-key.js';
import type { ContractTestApi } from './contract-api.js';
import { describeStoreContract, longestClientKey } from './store-contract.js';

describe('the store contract', () => {
  it('uses the longest client key the guard accepts', () => {
    expect(validateKey(longestClientKey('\u{1F600}'))).toBeUndefined();
    expect(validateKey(longestClientKey('\u{1F600}') + '\u{1F600}')).toBeDefined();
  });

  it("reports only the factory's error when the harness cannot be built, not a failed close after it", async () => {
    // Every case also failed with "Cannot read properties of undefined (reading 'close')" (an adversarial helper).
    const hooks: { before: (() => Promise<void>)[]; after: (() => Promise<unknown>)[] } = { before: [], after: [] };
    const api: ContractTestApi = {
      describe: (_name, body) => body(),
      it: () => undefined,
      beforeEach: (body) => void hooks.before.push(body),
      afterEach: (body) => void hooks.after.push(body),
      expect: () => ({}) as never,
    };
    describeStoreContract('unbuildable', () => Promise.reject(new Error('no store here')), 300, api);
    for (const before of hooks.before) await expect(before()).rejects.toThrow('no store here');
    for (const after of hooks.after) await expect(after()).resolves.toBeUndefined();
  });
});
