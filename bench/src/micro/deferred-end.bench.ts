import { IncomingMessage, ServerResponse } from 'node:http';
import { Socket } from 'node:net';
import { pathToFileURL } from 'node:url';

/**
 * Why the in-process bench was run with V8's allocation-site pretenuring off, and what set the
 * collector off. A loop that answers one Node.js response after another, as that bench does, got
 * several times slower when each response's `end()` was replaced by a closure of its own that
 * defers the real `end()` by one microtask (what the guard did while it saved the answer), with
 * no guard code at all: 8 runs of 100,000 responses took 2.0-5.9 µs each against 1.2-1.3 µs
 * with a direct end(); the young-generation collections kept 5-6 MB alive each
 * (`--trace-gc-nvp`: new_space_survived). With `--no-allocation-site-pretenuring`, 1.5-2.1 µs.
 * Session 10 found the closure is the trigger, not the deferral: the same deferral by one
 * function shared by every response (`shared`, the original method kept under a symbol, as the
 * guard now does) costs what a direct end() costs (3.1 / 2.9 / 3.1 µs against 2.7 / 2.9 / 2.8,
 * the closure 20.8 / 18.9 / 3.5, on a slower machine).
 * `node [--no-allocation-site-pretenuring] dist/bench/src/micro/deferred-end.bench.js [direct|deferred|shared] [responses]`.
 */
const ORIGINAL_END = Symbol('originalEnd');
type Shared = ServerResponse & { [ORIGINAL_END]: (...args: unknown[]) => ServerResponse };
/** One function for every response: defers the response's own end() by one microtask. */
function sharedEnd(this: Shared, ...args: unknown[]): ServerResponse {
  void Promise.resolve().then(() => this[ORIGINAL_END].apply(this, args));
  return this;
}

if (import.meta.url === pathToFileURL(process.argv[1]).href) {
  const responses = Number(process.argv.find((arg) => /^\d+$/.test(arg)) ?? 100_000);
  const mode = process.argv.includes('deferred') ? 'deferred' : process.argv.includes('shared') ? 'shared' : 'direct';
  const started = process.hrtime.bigint();
  for (let i = 0; i < responses; i++) {
    const res = new ServerResponse(new IncomingMessage(new Socket()));
    const end = res.end;
    if (mode === 'deferred') {
      res.end = function (...args: unknown[]) {
        void Promise.resolve().then(() => (end as (...a: unknown[]) => ServerResponse).apply(res, args));
        return res;
      } as ServerResponse['end'];
    } else if (mode === 'shared') {
      (res as Shared)[ORIGINAL_END] = end as Shared[typeof ORIGINAL_END];
      res.end = sharedEnd as ServerResponse['end'];
    }
    res.setHeader('content-type', 'application/json');
    res.end('{"id":1,"orderNo":"A-1","amount":100,"status":"PENDING"}');
    for (let turns = 0; turns < 1000 && !res.finished; turns++) await Promise.resolve();
  }
  const ns = Number(process.hrtime.bigint() - started) / responses;
  console.log(JSON.stringify({ end: mode, responses, ns: Math.round(ns) }));
}
