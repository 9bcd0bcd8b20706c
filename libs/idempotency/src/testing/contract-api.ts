import type { ClaimResult, IdempotencyStore } from '../index.js';

/** How a store's test setup provides a fresh store and lets time pass. */
export interface StoreHarness {
  store: IdempotencyStore;
  /** Lets `ms` milliseconds pass for the store (fake timers, or real time for Redis expiry). */
  elapse(ms: number): Promise<void>;
  close?(): Promise<void>;
  /**
   * For a store whose keyspace the app shares (Redis): writes something that is no idempotency
   * record under `key` (a value of the app's own), and returns a check that it is still there,
   * unchanged. The contract then asserts that `forget` answers `not_a_record` and deletes
   * nothing, and that `get` throws `IdempotencyNotARecordError`. Leave it out for a store that
   * holds only its own records (memory, PostgreSQL): that case then passes without a check.
   */
  writeForeignValue?(key: string): Promise<() => Promise<boolean>>;
}

/**
 * The matchers the contract uses: Jest's and Vitest's `expect` both have them. Test runners
 * that inject no globals pass their own API to `describeStoreContract`.
 */
export interface ContractMatchers {
  toBe(expected: unknown): void;
  toEqual(expected: unknown): void;
  toStrictEqual(expected: unknown): void;
  toMatchObject(expected: object): void;
  toBeGreaterThan(expected: number): void;
  toBeLessThanOrEqual(expected: number): void;
  toBeUndefined(): void;
  toHaveLength(expected: number): void;
}

/** The test runner functions the contract calls (`describe`, `it`, hooks and `expect`). */
export interface ContractTestApi {
  describe(name: string, body: () => void): void;
  it(name: string, body: () => Promise<void>): void;
  beforeEach(body: () => Promise<void>): void;
  afterEach(body: () => Promise<unknown>): void;
  expect(actual: unknown): ContractMatchers;
}

/** The runner's globals (Jest; Vitest with `globals: true`). */
export function globalTestApi(): ContractTestApi {
  const api = globalThis as unknown as Partial<ContractTestApi>;
  const { describe, it, beforeEach, afterEach, expect } = api;
  if (!describe || !it || !beforeEach || !afterEach || !expect) {
    throw new Error('describeStoreContract: the test runner has no globals; pass { describe, it, beforeEach, afterEach, expect }');
  }
  return { describe, it, beforeEach, afterEach, expect };
}

/** The store and fresh key of one contract case, as the suite's `beforeEach` made them. */
export interface ContractSubject {
  readonly store: IdempotencyStore;
  readonly key: string;
  elapse(ms: number): Promise<void>;
  /** Claims the case's key with `fingerprint` (default `fp-1`) for `lease` (default the suite's lease). */
  claim(token: string, fingerprint?: string, lease?: number): Promise<ClaimResult>;
  /** The harness's `writeForeignValue`, when it has one. */
  readonly writeForeignValue: StoreHarness['writeForeignValue'];
}
