import { createParamDecorator, type ExecutionContext } from '@nestjs/common';

/**
 * The signal of each guarded call that holds a claim, by the call's request (or RPC context),
 * then by handler: Nest calls every `@EventPattern` handler of one pattern with the same objects.
 */
const signals = new WeakMap<object, WeakMap<object, AbortSignal>>();
const NEVER_ABORTED = new AbortController().signal;

/** The object that stands for the call: the HTTP request; for a message, its context (else its data). */
function callOf(ctx: ExecutionContext): object | undefined {
  const [first, second] = ctx.getArgs<unknown[]>();
  const candidates = ctx.getType() === 'http' ? [first] : [second, first];
  return candidates.find((arg): arg is object => typeof arg === 'object' && arg !== null);
}

/** Hands the claim's signal to `@LeaseSignal()` parameters of this call (the guard calls it). */
export function rememberLeaseSignal(ctx: ExecutionContext, signal: AbortSignal): void {
  const call = callOf(ctx);
  if (!call) return;
  let byHandler = signals.get(call);
  if (!byHandler) signals.set(call, (byHandler = new WeakMap()));
  byHandler.set(ctx.getHandler(), signal);
}

/**
 * A handler parameter: the `AbortSignal` that aborts when the guard loses this call's claim while
 * the handler runs (a renewal refused, the store down until the lease ended, `maxHoldSeconds`
 * passed): a retry may then run the handler again, so a handler that has not made its effect yet
 * can stop. Never aborts on a call the guard does not hold a claim for.
 *
 * @example
 * ```ts
 * @Post()
 * @NoRepeatSubmit()
 * async pay(@Body() dto: PayDto, @LeaseSignal() signal: AbortSignal) {
 *   const quote = await this.rates.quote(dto, { signal });
 *   signal.throwIfAborted();
 *   return this.payments.charge(quote);
 * }
 * ```
 */
export const LeaseSignal = createParamDecorator((_data: unknown, ctx: ExecutionContext): AbortSignal => {
  const call = callOf(ctx);
  return (call && signals.get(call)?.get(ctx.getHandler())) ?? NEVER_ABORTED;
});
