import { EventEmitter } from 'node:events';
import { requireFromPeers } from '../paths.js';

/** The part of autocannon 9's programmatic API the bench uses. */
interface AutocannonOptions {
  url: string;
  method?: string;
  headers?: Record<string, string>;
  body?: string;
  connections?: number;
  duration?: number;
  amount?: number;
  idReplacement?: boolean;
  timeout?: number;
}
interface AutocannonResult {
  duration: number;
  requests: { total: number; sent: number };
  errors: number;
  timeouts: number;
  statusCodeStats: Record<string, { count: number }>;
}
type AutocannonInstance = EventEmitter & PromiseLike<AutocannonResult> & { stop(): void };
type Autocannon = (options: AutocannonOptions) => AutocannonInstance;

let autocannon: Autocannon | undefined;
function load(): Autocannon {
  try {
    return (autocannon ??= requireFromPeers('autocannon') as Autocannon);
  } catch (error) {
    throw new Error(`autocannon is missing: it is a devDependency of the project ("autocannon": "9.0.0"); run npm install. ${(error as Error).message}`);
  }
}

/** Fails at once, with what to do, when autocannon is not installed. */
export function assertLoadGenerator(): void {
  load();
}

export interface LoadResult {
  /** Responses received within the run. */
  requests: number;
  /** Requests sent, including those still in flight when the run stopped (the server ran them). */
  sent: number;
  seconds: number;
  rps: number;
  /** Milliseconds, every response (not only 2xx), exact (autocannon's own histogram rounds to 1 ms). */
  p50: number;
  p99: number;
  statuses: Record<string, number>;
  errors: number;
}

export interface LoadOptions {
  url: string;
  headers: Record<string, string>;
  body: string;
  connections: number;
  /** Run for this long, or until `amount` requests. */
  seconds?: number;
  amount?: number;
}

/**
 * One autocannon run. `[<id>]` in a header is replaced by a fresh id on every request (both
 * modes carry one, so the load generator does the same work for every arm).
 */
export async function runLoad(options: LoadOptions): Promise<LoadResult> {
  let latencies = new Float64Array(1 << 16);
  let count = 0;
  const instance = load()({
    url: options.url,
    method: 'POST',
    headers: { 'content-type': 'application/json', ...options.headers },
    body: options.body,
    connections: options.connections,
    idReplacement: true,
    timeout: 10,
    ...(options.amount !== undefined ? { amount: options.amount } : { duration: options.seconds ?? 3 }),
  });
  instance.on('response', (_client: unknown, _status: number, _bytes: number, responseTimeMs: number) => {
    if (count === latencies.length) {
      const bigger = new Float64Array(latencies.length * 2);
      bigger.set(latencies);
      latencies = bigger;
    }
    latencies[count++] = responseTimeMs;
  });
  const result = await instance;
  const sorted = latencies.subarray(0, count).sort();
  const statuses: Record<string, number> = {};
  for (const [status, { count: n }] of Object.entries(result.statusCodeStats ?? {})) statuses[status] = n;
  return {
    requests: result.requests.total,
    sent: Math.max(result.requests.sent, result.requests.total),
    seconds: result.duration,
    rps: result.requests.total / result.duration,
    p50: percentile(sorted, 0.5),
    p99: percentile(sorted, 0.99),
    statuses,
    errors: result.errors + result.timeouts,
  };
}

function percentile(sorted: Float64Array, q: number): number {
  if (sorted.length === 0) return Number.NaN;
  return sorted[Math.min(sorted.length - 1, Math.floor(q * sorted.length))];
}

/** Sends one request and returns its status (seeding a replay key, probing an arm). */
export async function send(url: string, headers: Record<string, string>, body: string): Promise<number> {
  const response = await fetch(url, { method: 'POST', headers: { 'content-type': 'application/json', ...headers }, body });
  await response.arrayBuffer();
  return response.status;
}
