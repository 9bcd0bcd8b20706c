import type { ExecutionContext } from '@nestjs/common';
import { DEFAULTS } from './idempotency.constants.js';
import { IdempotencyConfigError } from './errors/idempotency.errors.js';
import type { FailMode, IdempotencyModuleOptions } from './idempotency.options.js';

/** Module options with every default filled in; built once, in one place. */
export interface ResolvedIdempotencyOptions {
  keyPrefix: string;
  expireSeconds: number;
  leaseSeconds: number;
  failMode: FailMode;
  replayHeaders: readonly string[];
  ignoreFields: readonly string[];
  getUser: (ctx: ExecutionContext) => string | number | undefined;
}

/** Token of the resolved options. */
export const IDEMPOTENCY_RESOLVED_OPTIONS = Symbol('IDEMPOTENCY_RESOLVED_OPTIONS');

/** `request.user.id` (the first argument; `switchToHttp()` would add closures on every call). */
const defaultGetUser = (ctx: ExecutionContext): string | number | undefined =>
  ctx.getArgByIndex<{ user?: { id?: string | number } } | undefined>(0)?.user?.id;

export function resolveOptions(options: IdempotencyModuleOptions): ResolvedIdempotencyOptions {
  const resolved: ResolvedIdempotencyOptions = {
    keyPrefix: options.keyPrefix ?? DEFAULTS.keyPrefix,
    expireSeconds: options.expireSeconds ?? DEFAULTS.expireSeconds,
    leaseSeconds: options.leaseSeconds ?? DEFAULTS.leaseSeconds,
    failMode: options.failMode ?? DEFAULTS.failMode,
    replayHeaders: (options.replayHeaders ?? DEFAULTS.replayHeaders)
      .map((name) => name.toLowerCase())
      .filter((name) => name !== 'set-cookie'),
    ignoreFields: options.ignoreFields ?? [],
    getUser: options.getUser ?? defaultGetUser,
  };
  assertPositive('expireSeconds', resolved.expireSeconds);
  assertPositive('leaseSeconds', resolved.leaseSeconds);
  if (!resolved.keyPrefix || resolved.keyPrefix.includes(':')) {
    throw new IdempotencyConfigError(`IdempotencyModule: keyPrefix must be non-empty and hold no ':' (got '${resolved.keyPrefix}')`);
  }
  return Object.freeze(resolved);
}

export function assertPositive(name: string, value: number | undefined, where = 'IdempotencyModule'): void {
  if (value !== undefined && !(Number.isFinite(value) && value > 0)) {
    throw new IdempotencyConfigError(`${where}: ${name} must be a positive number of seconds (got ${value})`);
  }
}
