// The testing entry point, `nestjs-idempotency/testing`: the contract every `IdempotencyStore`
// must meet, for the library's own stores and for yours. Runs under Jest or Vitest.
export { describeStoreContract } from './store-contract.js';
export type { ContractMatchers, ContractTestApi, StoreHarness } from './contract-api.js';
