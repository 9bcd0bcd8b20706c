import { IdempotencyConfigError } from '../../errors/idempotency.errors.js';
import { DEFAULTS } from '../../idempotency.constants.js';

/** Bounds of the local cache of completed records (`IdempotencyModuleOptions.localCache`). */
export interface LocalCacheOptions {
  /** Most records kept. Default 10,000. */
  maxEntries?: number;
  /**
   * Most bytes kept, as V8 holds them: each record counts its storage key, fingerprint, body and
   * header texts (16 bytes each, then a byte a Latin-1 character, two for any other), plus 300
   * bytes, plus 24 a header. Default 33,554,432 (32 MiB).
   */
  maxBytes?: number;
}

/** The bounds in force. */
export type LocalCacheBounds = Required<LocalCacheOptions>;

/**
 * The bounds `localCache` asks for, over the defaults; undefined when it is off. Throws an
 * `IdempotencyConfigError` at start-up for a bound that is not a positive whole number.
 */
export function resolveLocalCache(option: boolean | LocalCacheOptions | undefined, where = 'IdempotencyModule'): LocalCacheBounds | undefined {
  if (option === undefined || option === false) return undefined;
  if (option !== true && (typeof option !== 'object' || option === null)) {
    throw new IdempotencyConfigError(`${where}: localCache must be true, false or { maxEntries, maxBytes } (got ${JSON.stringify(option)})`);
  }
  const bounds: LocalCacheBounds = {
    maxEntries: (option === true ? undefined : option.maxEntries) ?? DEFAULTS.localCacheMaxEntries,
    maxBytes: (option === true ? undefined : option.maxBytes) ?? DEFAULTS.localCacheMaxBytes,
  };
  for (const [name, value] of Object.entries(bounds)) {
    if (!(Number.isSafeInteger(value) && value > 0)) {
      throw new IdempotencyConfigError(`${where}: localCache.${name} must be a positive whole number (got ${String(value)})`);
    }
  }
  return bounds;
}
