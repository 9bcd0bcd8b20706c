import { IncomingMessage, ServerResponse } from 'node:http';
import { Socket } from 'node:net';
import { pathToFileURL } from 'node:url';

/**
 * Why the in-process bench is also run with V8's allocation-site pretenuring off. A loop that
 * answers one Node.js response after another, as that bench does, gets several times slower when
 * each `end()` is deferred by one microtask (what the guard does while it saves the answer), with
 * no guard code at all: on this project's machine, 8 runs of 100,000 responses took 2.0-5.9 µs
 * each (6 of 8 above 4.3 µs) against 1.2-1.3 µs with a direct end(); the young-generation
 * collections kept 5-6 MB alive each (`--trace-gc-nvp`: new_space_survived) against ~0. With
 * `--no-allocation-site-pretenuring`, 1.5-2.1 µs in 8 of 8. The guard's HTTP arms gained nothing
 * from that flag (bench/README.md, Findings).
 * `node [--no-allocation-site-pretenuring] dist/bench/src/micro/deferred-end.bench.js [direct|deferred] [responses]`.
 */
if (import.meta.url === pathToFileURL(process.argv[1]).href) {
  const responses = Number(process.argv.find((arg) => /^\d+$/.test(arg)) ?? 100_000);
  const deferred = process.argv.includes('deferred');
  const started = process.hrtime.bigint();
  for (let i = 0; i < responses; i++) {
    const res = new ServerResponse(new IncomingMessage(new Socket()));
    const end = res.end;
    if (deferred) {
      res.end = function (...args: unknown[]) {
        void Promise.resolve().then(() => (end as (...a: unknown[]) => ServerResponse).apply(res, args));
        return res;
      } as ServerResponse['end'];
    }
    res.setHeader('content-type', 'application/json');
    res.end('{"id":1,"orderNo":"A-1","amount":100,"status":"PENDING"}');
    for (let turns = 0; turns < 1000 && !res.finished; turns++) await Promise.resolve();
  }
  const ns = Number(process.hrtime.bigint() - started) / responses;
  console.log(JSON.stringify({ end: deferred ? 'deferred' : 'direct', responses, ns: Math.round(ns) }));
}
