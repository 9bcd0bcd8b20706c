import { createHash, randomUUID } from 'node:crypto';
import { pathToFileURL } from 'node:url';
import { MemoryIdempotencyStore, buildStorageKey, type SavedResponse } from '../../../libs/idempotency/src/index.js';
import { claimToken } from '../../../libs/idempotency/src/interceptors/claim-token.js';

/**
 * The memory store's footprint: heap bytes per entry and process RSS after 100k and 1M keys, each
 * a completed record as the bench endpoint leaves it (a UUID key under the usual prefix, an owner
 * token, a SHA-256 fingerprint, status, content-type and a 70-byte body). The store never drops
 * a live record, so the bench runs on a clock of its own: one millisecond passes per insert and
 * each record is kept `maxEntries - 1` ms, so once full every insert finds one expired record to
 * drop (the steady state of a store sized for its traffic). Run with `--expose-gc`:
 * `node --expose-gc dist/bench/src/micro/memory-store.bench.js [maxEntries] [--json]`.
 */

export interface MemoryPoint {
  inserted: number;
  size: number;
  heapBytesPerEntry: number;
  /** Time per claim + complete over the keys inserted since the previous point, microseconds. */
  microsPerInsert: number;
  heapUsedMB: number;
  rssMB: number;
}

export interface MemoryOutcome {
  maxEntries: number;
  points: MemoryPoint[];
  /** The store never held more than its bound. */
  withinBound: boolean;
}

const gc = (globalThis as { gc?: () => void }).gc;
function settle(): void {
  if (!gc) throw new Error('run with node --expose-gc');
  gc();
  gc();
}

export async function runMemoryBench(maxEntries: number, checkpoints = [100_000, 1_000_000]): Promise<MemoryOutcome> {
  const store = new MemoryIdempotencyStore({ maxEntries });
  let now = Date.now();
  Date.now = () => now;
  const retentionMs = maxEntries - 1;
  settle();
  const baseHeap = process.memoryUsage().heapUsed;
  const points: MemoryPoint[] = [];
  let withinBound = true;
  let inserted = 0;
  for (const target of checkpoints) {
    const from = inserted;
    const started = process.hrtime.bigint();
    while (inserted < target) {
      const key = buildStorageKey({ prefix: 'no_repeat', user: { ip: '127.0.0.1' }, handler: 'OrdersController.create', key: randomUUID() });
      // As the interceptor makes them: its owner token, a SHA-256 hex fingerprint.
      const token = claimToken();
      const fingerprint = createHash('sha256').update(key).digest('hex');
      await store.claim({ key, token, fingerprint, leaseMs: 30_000 });
      const response: SavedResponse = {
        statusCode: 201,
        headers: { 'content-type': 'application/json; charset=utf-8' },
        body: JSON.stringify({ id: inserted, orderNo: `ORD-${inserted}`, amount: 12.5, status: 'PENDING' }),
      };
      await store.complete(key, token, response, retentionMs);
      inserted++;
      now++;
      if (store.size > maxEntries) withinBound = false;
    }
    const microsPerInsert = Number(process.hrtime.bigint() - started) / 1000 / (inserted - from);
    settle();
    const memory = process.memoryUsage();
    points.push({
      inserted,
      microsPerInsert,
      size: store.size,
      heapBytesPerEntry: (memory.heapUsed - baseHeap) / store.size,
      heapUsedMB: memory.heapUsed / 1e6,
      rssMB: memory.rss / 1e6,
    });
  }
  return { maxEntries, points, withinBound };
}

if (import.meta.url === pathToFileURL(process.argv[1]).href) {
  const maxEntries = Number(process.argv.find((arg) => /^\d+$/.test(arg)) ?? 100_000);
  const outcome = await runMemoryBench(maxEntries);
  if (process.argv.includes('--json')) process.stdout.write(`${JSON.stringify(outcome)}\n`);
  else console.table(outcome.points);
}
