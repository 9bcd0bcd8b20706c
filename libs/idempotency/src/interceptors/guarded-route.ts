import type { ExecutionContext } from '@nestjs/common';
import type { NoRepeatSubmitMetadata } from '../decorators/no-repeat-submit.decorator.js';
import type { ResolvedIdempotencyOptions } from '../idempotency.config.js';
import type { FailMode } from '../idempotency.options.js';

/** A decorated handler's settings, merged over the module's once and cached per handler. */
export interface GuardedRoute {
  metadata: NoRepeatSubmitMetadata;
  /** `ControllerName.methodName`: the key's handler segment. */
  handler: string;
  expireMs: number;
  leaseMs: number;
  waitForResultMs: number;
  failMode: FailMode;
  useFingerprint: boolean;
  ignoreFields: ReadonlySet<string>;
  /** Where a client puts the key, named in the 400 answer. */
  keySource: string;
}

export function route(
  metadata: NoRepeatSubmitMetadata,
  ctx: ExecutionContext,
  defaults: ResolvedIdempotencyOptions,
): GuardedRoute {
  const { options, key } = metadata;
  return {
    metadata,
    handler: `${ctx.getClass().name}.${ctx.getHandler().name}`,
    expireMs: Math.ceil((options.expireSeconds ?? defaults.expireSeconds) * 1000),
    leaseMs: Math.ceil((options.leaseSeconds ?? defaults.leaseSeconds) * 1000),
    waitForResultMs: options.waitForResultMs ?? 0,
    failMode: options.failMode ?? defaults.failMode,
    useFingerprint: options.useRequestFingerprint ?? false,
    ignoreFields: new Set([...defaults.ignoreFields, ...(options.ignoreFields ?? [])]),
    keySource: 'path' in key ? `${options.idempotentKey as string}` : 'header' in key ? 'the Idempotency-Key header' : 'the request',
  };
}
