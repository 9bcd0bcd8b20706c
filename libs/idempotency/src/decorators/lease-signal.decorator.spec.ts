// How the guard hands a claim's signal to `@LeaseSignal()`: by call and handler, made only when
// read, and kept on frozen call objects too. (Unit: the ExecutionContext is a plain stand-in;
// the real wiring is proven over HTTP and RPC in test/lease-signal-events and lease-renewal.)
import { describe, expect, it } from '@jest/globals';
import { ROUTE_ARGS_METADATA } from '@nestjs/common/constants.js';
import type { ExecutionContext } from '@nestjs/common';
import { eventually } from '../../../../test/support/eventually.js';
import { LeaseRenewal } from '../interceptors/lease-renewal.js';
import { LeaseSignal, leaseSignalOf, rememberLeaseSignal } from './lease-signal.decorator.js';

/** The factory behind `@LeaseSignal()`, as Nest calls it. */
function leaseSignalFactory(): (data: unknown, ctx: ExecutionContext) => AbortSignal {
  class Probe {
    handle(_signal: AbortSignal) {}
  }
  LeaseSignal()(Probe.prototype, 'handle', 0);
  const args = Reflect.getMetadata(ROUTE_ARGS_METADATA, Probe, 'handle') as Record<string, { factory: (data: unknown, ctx: ExecutionContext) => AbortSignal }>;
  return Object.values(args)[0].factory;
}

const contextOf = (type: 'http' | 'rpc', args: unknown[], handler: object) =>
  ({ getType: () => type, getArgs: () => args, getHandler: () => handler }) as unknown as ExecutionContext;

describe('@LeaseSignal() hand-over', () => {
  const read = leaseSignalFactory();

  it('is recorded by Nest with leaseSignalOf as its factory, which is how a route knows it takes a signal', () => {
    // routeOptions looks for this factory among the handler's parameters; a route without it
    // gets no hand-over at all (no property on its request).
    expect(read).toBe(leaseSignalOf);
  });

  it('gives each handler of one call its own source, and the never-aborted signal to a call without a claim', () => {
    const request = {};
    const [a, b] = [() => 0, () => 1];
    const sources = [{ signal: new AbortController().signal }, { signal: new AbortController().signal }];
    rememberLeaseSignal(contextOf('rpc', [{ data: 1 }, request], a), sources[0]);
    rememberLeaseSignal(contextOf('rpc', [{ data: 1 }, request], b), sources[1]);
    expect(read(undefined, contextOf('rpc', [{ data: 1 }, request], a))).toBe(sources[0].signal);
    expect(read(undefined, contextOf('rpc', [{ data: 1 }, request], b))).toBe(sources[1].signal);
    const none = read(undefined, contextOf('http', [{}], a));
    expect(none.aborted).toBe(false);
    // The hand-over leaves no enumerable trace on the request.
    expect(Object.keys(request)).toEqual([]);
  });

  it('works on a frozen call object (a frozen RPC context)', () => {
    const frozen = Object.freeze({});
    const handler = () => 0;
    const source = { signal: new AbortController().signal };
    rememberLeaseSignal(contextOf('rpc', [{}, frozen], handler), source);
    expect(read(undefined, contextOf('rpc', [{}, frozen], handler))).toBe(source.signal);
  });

  it('the renewal makes its signal only when read; read after the claim was lost, it is already aborted with the reason', async () => {
    let lost = '';
    const renewal = new LeaseRenewal(30, 30, {
      renew: async () => false,
      renewed: () => undefined,
      failed: () => undefined,
      lost: (why) => (lost = why),
    });
    expect((renewal as unknown as { aborter?: AbortController }).aborter).toBeUndefined();
    // Waited for, not slept on: after a stall, the 30 ms deadline decides a turn after its timer.
    await eventually(() => lost !== '', { timeoutMs: 5000, what: 'the claim lost' });
    const signal = renewal.signal;
    expect(signal.aborted).toBe(true);
    expect((signal.reason as Error).message).toContain(lost);
    renewal.stop();
  });

  it('a signal read before the loss aborts when the claim is lost', async () => {
    const renewal = new LeaseRenewal(30, 30, { renew: async () => false, renewed: () => undefined, failed: () => undefined, lost: () => undefined });
    const signal = renewal.signal;
    expect(signal.aborted).toBe(false);
    await eventually(() => signal.aborted, { timeoutMs: 5000, what: 'the signal aborted' });
    renewal.stop();
  });
});
