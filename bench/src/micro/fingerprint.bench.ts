import { createHash } from 'node:crypto';
import { pathToFileURL } from 'node:url';
import { canonicalJson, fingerprintRequest } from '../../../libs/idempotency/src/keys/fingerprint.js';
import { requireFromPeers } from '../paths.js';

/**
 * Fingerprint mode: how fast request bodies of 1 KB, 100 KB and 1 MB are fingerprinted, in MB/s
 * of JSON text (MB = 10^6 bytes). The guard's canonical fingerprint (`fingerprintRequest`: keys
 * sorted at every depth, streamed into SHA-256) against the usual canonicalisers + SHA-256, the
 * unsorted `JSON.stringify` + SHA-256 ceiling, and the peer's own (unsorted `JSON.stringify` +
 * BLAKE2s). Contenders interleave over rounds; medians. Standalone:
 * `node dist/bench/src/micro/fingerprint.bench.js [--json]`; env `BENCH_FP_MS`, `BENCH_FP_ROUNDS`.
 */

type Stringify = (value: unknown) => string | undefined;
const safeStableStringify = requireFromPeers('safe-stable-stringify') as Stringify;
const fastJsonStableStringify = requireFromPeers('fast-json-stable-stringify') as Stringify;
const canonicalize = requireFromPeers('canonicalize') as Stringify;

const sha256 = (text: string | undefined) => createHash('sha256').update(text ?? '').digest('hex');

export const CONTENDERS: Record<string, (body: unknown) => string> = {
  'this guard (fingerprintRequest)': (body) =>
    fingerprintRequest({ method: 'POST', path: '/orders', body, contentType: 'application/json' }),
  'safe-stable-stringify + SHA-256': (body) => sha256(safeStableStringify(body)),
  'fast-json-stable-stringify + SHA-256': (body) => sha256(fastJsonStableStringify(body)),
  'canonicalize (RFC 8785) + SHA-256': (body) => sha256(canonicalize(body)),
  'JSON.stringify unsorted + SHA-256': (body) => sha256(JSON.stringify(body)),
  'peer: JSON.stringify + BLAKE2s': (body) => createHash('blake2s256').update(JSON.stringify(body)).digest('hex'),
};
export const GUARD = 'this guard (fingerprintRequest)';

/** A deterministic order-like body of about `bytes` of JSON: nested objects, arrays, unicode. */
export function makeBody(bytes: number): unknown {
  let seed = 42;
  const rand = () => ((seed = (seed * 1103515245 + 12345) & 0x7fffffff) / 0x7fffffff);
  const word = () => Math.floor(rand() * 1e9).toString(36);
  const items: unknown[] = [];
  const body = { orderNo: 'ORD-2026-000123', customer: { id: 'cus_42', email: 'ada@example.com', name: 'Ada Lovelace', tier: 'gold' }, currency: 'EUR', items, note: 'Livraison après 18h — merci', createdAt: '2026-11-30T10:00:00.000Z' };
  while (JSON.stringify(body).length < bytes) {
    items.push({ sku: `SKU-${word()}`, qty: 1 + Math.floor(rand() * 5), price: Math.round(rand() * 10000) / 100, name: `Item ${word()} ${word()}`, tags: [word(), word()], attrs: { color: word(), size: ['S', 'M', 'L'][Math.floor(rand() * 3)], gift: rand() > 0.5, weightKg: rand() * 3 } });
  }
  return body;
}

export const SIZES = [
  { label: '1 KB', bytes: 1_000 },
  { label: '100 KB', bytes: 100_000 },
  { label: '1 MB', bytes: 1_000_000 },
];

export interface FingerprintResult {
  size: string;
  bodyBytes: number;
  /** Median MB/s per contender. */
  mbPerSecond: Record<string, number>;
}

function measure(fn: (body: unknown) => string, body: unknown, ms: number): number {
  let runs = 0;
  const start = process.hrtime.bigint();
  const end = start + BigInt(ms) * 1_000_000n;
  let now = start;
  do {
    fn(body);
    runs++;
    now = process.hrtime.bigint();
  } while (now < end);
  return runs / (Number(now - start) / 1e9);
}

const median = (values: number[]) => [...values].sort((a, b) => a - b)[values.length >> 1];

export function runFingerprintBench(ms = Number(process.env.BENCH_FP_MS ?? 150), rounds = Number(process.env.BENCH_FP_ROUNDS ?? 5)) {
  const results: FingerprintResult[] = [];
  for (const size of SIZES) {
    const body = makeBody(size.bytes);
    const bodyBytes = Buffer.byteLength(JSON.stringify(body));
    if (canonicalJson(body) !== safeStableStringify(body)) throw new Error('canonicalJson and safe-stable-stringify disagree on the test body');
    const perSecond: Record<string, number[]> = {};
    for (const fn of Object.values(CONTENDERS)) measure(fn, body, Math.min(ms, 100));
    for (let round = 0; round < rounds; round++) {
      for (const [name, fn] of Object.entries(CONTENDERS)) (perSecond[name] ??= []).push(measure(fn, body, ms));
    }
    const mbPerSecond: Record<string, number> = {};
    for (const [name, values] of Object.entries(perSecond)) mbPerSecond[name] = (median(values) * bodyBytes) / 1e6;
    results.push({ size: size.label, bodyBytes, mbPerSecond });
  }
  // The per-request cost in key mode: the fingerprint of the bench's own small order body.
  const small = { orderNo: 'ORD-1', amount: 12.5 };
  const fingerprint = CONTENDERS[GUARD];
  measure(fingerprint, small, 100);
  const smallPerSecond = median(Array.from({ length: rounds }, () => measure(fingerprint, small, ms)));
  return { results, smallBodyMicroseconds: 1e6 / smallPerSecond };
}

export function fingerprintTable(results: FingerprintResult[]): string {
  const names = Object.keys(CONTENDERS);
  const head = `| MB/s (median) | ${results.map((r) => `${r.size} (${r.bodyBytes.toLocaleString('en-US')} B)`).join(' | ')} |`;
  const rule = `|---|${results.map(() => '---:').join('|')}|`;
  const rows = names.map((name) => `| ${name} | ${results.map((r) => r.mbPerSecond[name].toFixed(0)).join(' | ')} |`);
  const vsSafe = `| guard ÷ safe-stable-stringify | ${results.map((r) => (r.mbPerSecond[GUARD] / r.mbPerSecond['safe-stable-stringify + SHA-256']).toFixed(2)).join(' | ')} |`;
  const vsPlain = `| guard ÷ unsorted JSON.stringify | ${results.map((r) => (r.mbPerSecond[GUARD] / r.mbPerSecond['JSON.stringify unsorted + SHA-256']).toFixed(2)).join(' | ')} |`;
  return [head, rule, ...rows, vsSafe, vsPlain].join('\n');
}

if (import.meta.url === pathToFileURL(process.argv[1]).href) {
  const outcome = runFingerprintBench();
  if (process.argv.includes('--json')) process.stdout.write(`${JSON.stringify(outcome)}\n`);
  else process.stdout.write(`${fingerprintTable(outcome.results)}\n\nSmall body (${JSON.stringify({ orderNo: 'ORD-1', amount: 12.5 }).length} B) request fingerprint: ${outcome.smallBodyMicroseconds.toFixed(2)} µs\n`);
}
