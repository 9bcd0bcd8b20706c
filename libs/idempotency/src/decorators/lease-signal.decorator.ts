import { createParamDecorator, type ExecutionContext } from '@nestjs/common';
// TypeScript's record of a method's parameter types (`emitDecoratorMetadata`).
import { PARAMTYPES_METADATA } from '@nestjs/common/constants.js';

/** What holds a call's signal: the claim, whose signal is made when first read. */
interface SignalSource {
  readonly signal: AbortSignal;
}

/** One handler's signal source on a call; `next`: another handler's on the same call. */
interface LeaseEntry {
  handler: object;
  source: SignalSource;
  next: LeaseEntry | undefined;
}

/**
 * The sources of each guarded call that holds a claim, on the call's object (the HTTP request, or
 * the RPC context) under a symbol, by handler: Nest calls every `@EventPattern` handler of one
 * pattern with the same objects. A property rather than a WeakMap: WeakMap entries outlive
 * young-generation collections, and every guarded request then kept its entry until a full one.
 * A call object that cannot take a property (frozen) falls back to the WeakMap.
 */
const LEASES = Symbol('nestjs-idempotency.leases');
const sealed = new WeakMap<object, LeaseEntry>();
const NEVER_ABORTED = new AbortController().signal;

type CallObject = { [LEASES]?: LeaseEntry };

/** The object that stands for the call: the HTTP request; for a message, its context (else its data). */
function callOf(ctx: ExecutionContext): object | undefined {
  const [first, second] = ctx.getArgs<unknown[]>();
  const candidates = ctx.getType() === 'http' ? [first] : [second, first];
  return candidates.find((arg): arg is object => typeof arg === 'object' && arg !== null);
}

function entriesOf(call: object): LeaseEntry | undefined {
  return Object.isExtensible(call) || LEASES in call ? (call as CallObject)[LEASES] : sealed.get(call);
}

/**
 * Hands the claim's signal to `@LeaseSignal()` parameters of this call (the guard calls it, on
 * routes whose handler has one: see `takesLeaseSignal`).
 */
export function rememberLeaseSignal(ctx: ExecutionContext, source: SignalSource): void {
  const call = callOf(ctx);
  if (!call) return;
  const handler = ctx.getHandler();
  const first = entriesOf(call);
  for (let entry = first; entry; entry = entry.next) {
    if (entry.handler === handler) {
      entry.source = source;
      return;
    }
  }
  const entry: LeaseEntry = { handler, source, next: first };
  if (Object.isExtensible(call) || LEASES in call) (call as CallObject)[LEASES] = entry;
  else sealed.set(call, entry);
}

const leaseSignalParameter = createParamDecorator(leaseSignalOf);

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
export function LeaseSignal(...dataOrPipes: Parameters<typeof leaseSignalParameter>): ParameterDecorator {
  const decorate = leaseSignalParameter(...dataOrPipes);
  return (target, key, index) => {
    decorate(target, key, index);
    // Declared `AbortSignal`, as above: a global ValidationPipe({ transform: true,
    // validateCustomDecorators: true }) rebuilt the parameter as that class, and `new
    // AbortSignal()` throws (500 on every request, an adversarial helper). Recorded as `Object`,
    // which pipes leave as it is; TypeScript records the types before parameter decorators run.
    if (key === undefined) return;
    const types: unknown = Reflect.getMetadata(PARAMTYPES_METADATA, target, key);
    if (!Array.isArray(types) || types[index] !== AbortSignal) return;
    const recorded = [...(types as unknown[])];
    recorded[index] = Object;
    Reflect.defineMetadata(PARAMTYPES_METADATA, recorded, target, key);
  };
}

/** What `@LeaseSignal()` gives a handler (Nest keeps it as the parameter's factory). */
export function leaseSignalOf(_data: unknown, ctx: ExecutionContext): AbortSignal {
  const call = callOf(ctx);
  const handler = ctx.getHandler();
  for (let entry = call && entriesOf(call); entry; entry = entry.next) {
    if (entry.handler === handler) return entry.source.signal;
  }
  return NEVER_ABORTED;
}
