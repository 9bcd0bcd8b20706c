import { Observable } from 'rxjs';

/** What a transport does at the two ends of a handler it runs while holding the claim. */
export interface HeldRunHooks {
  /**
   * The handler succeeded: its first value (or its completion without one). `cut` is true when
   * the run was cut off from the client before (an outer timeout, a client that went away), so
   * the client never got this value. The value is sent on once this settles.
   */
  succeeded(value: unknown, cut: boolean): Promise<void>;
  /**
   * The handler failed before any value; its error is sent on once this settles. `cut` as for
   * `succeeded`: the client never gets the answer to this error.
   */
  failed(cut: boolean): Promise<void>;
  /**
   * The handler failed after its first value (a stream that errors late), while its subscriber
   * is still there (one that took the value and left answered with it); its error is sent on
   * once this settles. Where the transport answers with the error (Nest answers an HTTP
   * handler's Observable with its last value or its error), the run failed: the answer to the
   * error must not be saved, and the key is released. Absent: the first value stands (an RPC
   * client got it).
   */
  failedAfterValue?(): Promise<void>;
  /** The run was cut off from the client while the handler still ran. */
  cut?(): void;
}

/**
 * The handler's Observable, run while holding its claim. Nothing outside the handler frees the key
 * while it runs: when the subscriber goes away first (an outer `timeout()`, a client that
 * disconnected), the handler is still listened to, until it settles or `keepAliveMs` pass (the
 * lease, after which the store frees the key anyway), so that its success is recorded and its
 * failure releases the key. One Observable rather than an operator chain: this runs on every
 * first request.
 */
export function runHeld(handler: Observable<unknown>, hooks: HeldRunHooks, keepAliveMs: number): Observable<unknown> {
  return new Observable<unknown>((subscriber) => {
    let state: 'running' | 'succeeded' | 'failed' = 'running';
    let cut = false;
    let finished = false;
    let sent: Promise<unknown> = Promise.resolve();
    let keepAlive: NodeJS.Timeout | undefined;
    const succeed = (value: unknown) => {
      state = 'succeeded';
      sent = hooks.succeeded(value, cut);
    };
    const source = handler.subscribe({
      next: (value) => {
        if (state === 'running') succeed(value);
        sent = sent.then(() => subscriber.next(value));
      },
      error: (error: unknown) => {
        clearTimeout(keepAlive);
        const ready =
          state === 'running'
            ? ((state = 'failed'), hooks.failed(cut))
            : hooks.failedAfterValue
              ? // After the value went on: a subscriber that took it and left (an outer take(1))
                // answered with it, and never gets this error.
                sent.then(() => (subscriber.closed ? undefined : hooks.failedAfterValue!()))
              : sent;
        void ready.then(() => {
          finished = true;
          subscriber.error(error);
        });
      },
      complete: () => {
        clearTimeout(keepAlive);
        if (state === 'running') succeed(undefined);
        void sent.then(() => {
          finished = true;
          subscriber.complete();
        });
      },
    });
    return () => {
      if (finished || state !== 'running') {
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
