import { Observable } from 'rxjs';

/** What a transport does at the two ends of a handler it runs while holding the claim. */
export interface HeldRunHooks {
  /**
   * The handler succeeded: it completed, and this is its first value (undefined when it had
   * none). `cut` is true when the run was cut off from the client before (an outer timeout, a
   * client that went away), so the client never got its answer. Its values are sent on once this
   * settles.
   */
  succeeded(value: unknown, cut: boolean): Promise<void>;
  /**
   * The handler failed, whatever it emitted before; its values and its error are sent on once
   * this settles. `cut` as for `succeeded`: the client never gets the answer to this error.
   */
  failed(cut: boolean): Promise<void>;
  /** The run was cut off from the client while the handler still ran. */
  cut?(): void;
}

/**
 * The handler's Observable, run while holding its claim. Its outcome is how it ends: Nest answers
 * an Observable with its last value or its error, so a handler that emits a value and then fails
 * has failed. Its values are held until it ends, and sent on after the hook of its outcome (a
 * saved result, a released key). Nothing outside the handler frees the key while it runs: when the
 * subscriber goes away first (an outer `timeout()`, a client that disconnected), the handler is
 * still listened to, until it settles or `keepAliveMs` pass (the lease, after which the store
 * frees the key anyway), so that its success is recorded and its failure releases the key. One
 * Observable rather than an operator chain: this runs on every first request.
 */
export function runHeld(handler: Observable<unknown>, hooks: HeldRunHooks, keepAliveMs: number): Observable<unknown> {
  return new Observable<unknown>((subscriber) => {
    let settled = false;
    let cut = false;
    let finished = false;
    let keepAlive: NodeJS.Timeout | undefined;
    // Most handlers emit one value: no array for it.
    let first: unknown;
    let more: unknown[] | undefined;
    let count = 0;
    const sendValues = () => {
      if (count > 0) subscriber.next(first);
      for (let i = 0; more !== undefined && i < more.length; i++) subscriber.next(more[i]);
    };
    const source = handler.subscribe({
      next: (value) => {
        if (count++ === 0) first = value;
        else (more ??= []).push(value);
      },
      error: (error: unknown) => {
        clearTimeout(keepAlive);
        settled = true;
        void hooks.failed(cut).then(() => {
          finished = true;
          sendValues();
          subscriber.error(error);
        });
      },
      complete: () => {
        clearTimeout(keepAlive);
        settled = true;
        void hooks.succeeded(first, cut).then(() => {
          finished = true;
          sendValues();
          subscriber.complete();
        });
      },
    });
    return () => {
      if (finished || settled) {
        source.unsubscribe();
        return;
      }
      cut = true;
      hooks.cut?.();
      keepAlive = setTimeout(() => source.unsubscribe(), keepAliveMs);
      keepAlive.unref();
    };
  });
}
