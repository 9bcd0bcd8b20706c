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
  /** Largest response body kept for replay, in bytes. */
  maxResponseBytes: number;
  /** The handler sends its own answer (`@Res()` / `@Next()` without passthrough): Nest sends none. */
  sendsOwnResponse: boolean;
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
    maxResponseBytes: options.maxResponseBytes ?? defaults.maxResponseBytes,
    sendsOwnResponse: sendsOwnResponse(ctx),
  };
}

/** `@nestjs/common`'s ROUTE_ARGS_METADATA and RouteParamtypes.RESPONSE / NEXT (stable since Nest 5). */
const ROUTE_ARGS_METADATA = '__routeArguments__';
const RESPONSE_ARG = 1;
const NEXT_ARG = 2;

/** Whether Nest leaves the answer to the handler, as its router decides (`isResponseHandled`). */
function sendsOwnResponse(ctx: ExecutionContext): boolean {
  const args: Record<string, { data?: { passthrough?: boolean } }> =
    Reflect.getMetadata(ROUTE_ARGS_METADATA, ctx.getClass(), ctx.getHandler().name) ?? {};
  return Object.entries(args).some(([slot, arg]) => {
    const type = Number(slot.split(':')[0]);
    return (type === RESPONSE_ARG || type === NEXT_ARG) && !arg.data?.passthrough;
  });
}
