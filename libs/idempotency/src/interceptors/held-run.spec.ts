import { describe, expect, it } from '@jest/globals';
import { EMPTY, NEVER, Subject, concat, lastValueFrom, of, throwError, toArray } from 'rxjs';
import { runHeld, type HeldRunHooks } from './held-run.js';

/** Hooks that record what the run told them; `succeeded` takes a few ms, as a store save does. */
function recorder() {
  const events: string[] = [];
  const hooks: HeldRunHooks = {
    succeeded: async (value, cut) => {
      await new Promise((resolve) => setTimeout(resolve, 5));
      events.push(`succeeded ${JSON.stringify(value)}${cut ? ' (cut)' : ''}`);
    },
    failed: async (cut) => {
      events.push(`failed${cut ? ' (cut)' : ''}`);
    },
    cut: () => events.push('cut'),
  };
  return { events, hooks };
}

const tick = () => new Promise((resolve) => setImmediate(resolve));

describe('runHeld: a handler run while its key is held', () => {
  it('records success before the first value is sent on, and sends every value in order', async () => {
    const { events, hooks } = recorder();
    const values: unknown[] = [];
    const result = runHeld(of(1, 2, 3), hooks, 1000);
    await new Promise<void>((resolve) =>
      result.subscribe({
        next: (value) => {
          values.push(value);
          events.push(`sent ${String(value)}`);
        },
        complete: resolve,
      }),
    );
    expect(values).toEqual([1, 2, 3]);
    expect(events).toEqual(['succeeded 1', 'sent 1', 'sent 2', 'sent 3']);
  });

  it('reports a failure before any value, then passes the error on', async () => {
    const { events, hooks } = recorder();
    const failure = new Error('planned');
    await expect(lastValueFrom(runHeld(throwError(() => failure), hooks, 1000))).rejects.toBe(failure);
    expect(events).toEqual(['failed']);
  });

  it('counts a completion without a value as success (the app answered)', async () => {
    const { events, hooks } = recorder();
    await expect(lastValueFrom(runHeld(EMPTY, hooks, 1000), { defaultValue: 'none' })).resolves.toBe('none');
    expect(events).toEqual(['succeeded undefined']);
  });

  it('keeps a success when the handler fails after its first value', async () => {
    const { events, hooks } = recorder();
    const failure = new Error('late');
    const values = lastValueFrom(runHeld(concat(of(1), throwError(() => failure)), hooks, 1000).pipe(toArray()));
    await expect(values).rejects.toBe(failure);
    expect(events).toEqual(['succeeded 1']);
  });

  it('tells a transport that answers with the error (HTTP) of a failure after the first value, before passing it on', async () => {
    const { events, hooks } = recorder();
    hooks.failedAfterValue = async () => {
      events.push('failed after value');
    };
    const failure = new Error('late');
    const run = runHeld(concat(of(1), throwError(() => failure)), hooks, 1000);
    await expect(lastValueFrom(run.pipe(toArray()))).rejects.toBe(failure);
    expect(events).toEqual(['succeeded 1', 'failed after value']);
  });

  it('keeps listening when the subscriber goes away mid-run, and records the late success as cut', async () => {
    const { events, hooks } = recorder();
    const handler = new Subject<number>();
    const subscription = runHeld(handler, hooks, 1000).subscribe();
    subscription.unsubscribe(); // an outer timeout, a client gone
    expect(events).toEqual(['cut']);
    expect(handler.observed).toBe(true);
    handler.next(7);
    handler.complete();
    await new Promise((resolve) => setTimeout(resolve, 20));
    expect(events).toEqual(['cut', 'succeeded 7 (cut)']);
  });

  it('keeps listening when the subscriber goes away mid-run, and reports the late failure as cut', async () => {
    const { events, hooks } = recorder();
    const handler = new Subject<number>();
    runHeld(handler, hooks, 1000).subscribe().unsubscribe();
    handler.error(new Error('late failure'));
    await tick();
    // Cut: the client never gets the answer to this error, so saveStatuses never saves it.
    expect(events).toEqual(['cut', 'failed (cut)']);
  });

  it('stops listening after keepAliveMs, so a handler that never settles is not held forever', async () => {
    const { hooks } = recorder();
    const handler = new Subject<number>();
    runHeld(handler, hooks, 20).subscribe().unsubscribe();
    expect(handler.observed).toBe(true);
    await new Promise((resolve) => setTimeout(resolve, 40));
    expect(handler.observed).toBe(false);
  });

  it('stops the handler at once when the subscriber goes away after it succeeded', async () => {
    const { events, hooks } = recorder();
    const handler = new Subject<number>();
    const subscription = runHeld(handler, hooks, 1000).subscribe();
    handler.next(1);
    subscription.unsubscribe();
    expect(handler.observed).toBe(false);
    await new Promise((resolve) => setTimeout(resolve, 20));
    expect(events).toEqual(['succeeded 1']);
  });

  it('never settles a handler that never answers while subscribed', async () => {
    const { events, hooks } = recorder();
    const subscription = runHeld(NEVER, hooks, 1000).subscribe();
    await tick();
    expect(events).toEqual([]);
    subscription.unsubscribe();
  });
});
