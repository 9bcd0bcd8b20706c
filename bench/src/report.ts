import { ARM_LABELS, REDIS_ARMS, type AdapterName, type ArmName } from './arm-names.js';
import { addCounts, histogram, median } from './driver/stats.js';
import type { CrashResult } from './phases/crash.js';
import type { StormResult } from './phases/storm.js';
import type { Mode, Sample } from './phases/throughput.js';

export interface Row {
  adapter: AdapterName;
  arm: ArmName;
  mode: Mode | 'baseline' | 'floor';
  rounds: number;
  rps: number;
  p50: number;
  p99: number;
  /** Median over rounds of (arm ÷ bare of the same round and adapter). */
  ratioToBare: number;
  p99RatioToBare: number;
  /** Median over rounds of (arm ÷ the peer in the same round, adapter and mode). */
  ratioToPeer?: number;
  redisSentPerRequest?: number;
  redisInScriptPerRequest?: number;
  /** CPU per request sent, microseconds: the arm's process, and the Redis server (Redis arms). */
  appCpuMicros: number;
  redisCpuMicros?: number;
  /** (app + Redis CPU) − bare's app CPU, same round and adapter, median: what the guard adds. */
  addedCpuMicros: number;
  /** Commands Redis ran, sent and in-script, by name (`INFO commandstats`). */
  redisCallsByCommand?: Record<string, number>;
  statuses: Record<string, number>;
  errors: number;
  handlerRunsPerRequest: number;
  requests: number;
}

const PEER: ArmName = 'peer-redis';

/** Medians and paired ratios per (adapter, arm, mode). */
export function summarise(samples: readonly Sample[]): Row[] {
  const rows: Row[] = [];
  const find = (round: number, adapter: AdapterName, arm: ArmName, mode: Mode) =>
    samples.find((s) => s.round === round && s.adapter === adapter && s.arm === arm && s.mode === mode);
  const groups = new Map<string, Sample[]>();
  for (const s of samples) {
    const key = `${s.adapter}|${s.arm}|${s.mode}`;
    groups.set(key, [...(groups.get(key) ?? []), s]);
  }
  for (const group of groups.values()) {
    const { adapter, arm, mode } = group[0];
    const ratios = (of: (s: Sample) => number, base: (s: Sample) => Sample | undefined) =>
      median(group.map((s) => { const b = base(s); return b ? of(s) / of(b) : Number.NaN; }));
    const bare = (s: Sample) => find(s.round, adapter, 'bare', 'unique');
    const peer = (s: Sample) => find(s.round, adapter, PEER, mode);
    const requests = group.reduce((sum, s) => sum + s.requests, 0);
    // Per request: over the requests sent, since the server also ran those in flight at the stop.
    const sent = group.reduce((sum, s) => sum + s.sent, 0);
    const statuses: Record<string, number> = {};
    for (const s of group) addCounts(statuses, s.statuses);
    const row: Row = {
      adapter,
      arm,
      mode: arm === 'bare' ? 'baseline' : arm === 'empty-interceptor' ? 'floor' : mode,
      rounds: group.length,
      rps: median(group.map((s) => s.rps)),
      p50: median(group.map((s) => s.p50)),
      p99: median(group.map((s) => s.p99)),
      ratioToBare: ratios((s) => s.rps, bare),
      appCpuMicros: median(group.map((s) => s.appCpuMicrosPerRequest)),
      redisCpuMicros: REDIS_ARMS.has(arm) ? median(group.map((s) => s.redisCpuMicrosPerRequest ?? Number.NaN)) : undefined,
      addedCpuMicros: median(
        group.map((s) => {
          const b = bare(s);
          return b ? s.appCpuMicrosPerRequest + (s.redisCpuMicrosPerRequest ?? 0) - b.appCpuMicrosPerRequest : Number.NaN;
        }),
      ),
      p99RatioToBare: ratios((s) => s.p99, bare),
      statuses,
      errors: group.reduce((sum, s) => sum + s.errors, 0),
      handlerRunsPerRequest: group.reduce((sum, s) => sum + s.handlerRuns, 0) / sent,
      requests,
    };
    if (arm !== 'bare' && group.some((s) => peer(s))) row.ratioToPeer = ratios((s) => s.rps, peer);
    if (REDIS_ARMS.has(arm)) {
      const byCommand: Record<string, number> = {};
      for (const s of group) if (s.redis) addCounts(byCommand, s.redis.calls);
      row.redisCallsByCommand = byCommand;
      row.redisSentPerRequest = group.reduce((sum, s) => sum + (s.redis?.sentTotal ?? 0), 0) / sent;
      row.redisInScriptPerRequest = group.reduce((sum, s) => sum + (s.redis?.inScript ?? 0), 0) / sent;
    }
    rows.push(row);
  }
  return rows;
}

const fmt = (value: number | undefined, digits = 2) => (value === undefined || !Number.isFinite(value) ? '—' : value.toFixed(digits));
const int = (value: number) => Math.round(value).toLocaleString('en-US');

export function throughputTable(rows: readonly Row[], unavailable: ReadonlyMap<ArmName, string>): string {
  const lines = [
    '| adapter | arm | keys | req/s | p50 ms | p99 ms | × bare | p99 × bare | × peer | CPU µs/req app + Redis | added µs/req | Redis cmds/req (in-script) | statuses | handler runs/req |',
    '|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---|---|---:|',
  ];
  for (const r of rows) {
    const redis = r.redisSentPerRequest === undefined ? '—' : `${fmt(r.redisSentPerRequest)} (${fmt(r.redisInScriptPerRequest, 1)})`;
    lines.push(
      `| ${r.adapter} | ${ARM_LABELS[r.arm]} | ${r.mode} | ${int(r.rps)} | ${fmt(r.p50)} | ${fmt(r.p99)} | ${fmt(r.ratioToBare)} | ${fmt(r.p99RatioToBare)} | ${fmt(r.ratioToPeer)} | ${fmt(r.appCpuMicros, 0)}${r.redisCpuMicros === undefined ? '' : ` + ${fmt(r.redisCpuMicros, 0)}`} | ${r.arm === 'bare' ? '—' : fmt(r.addedCpuMicros, 0)} | ${redis} | ${histogram(r.statuses)}${r.errors ? `, ${r.errors} errors` : ''} | ${fmt(r.handlerRunsPerRequest, 3)} |`,
    );
  }
  for (const [arm, reason] of unavailable) lines.push(`| all | ${ARM_LABELS[arm]} | — | — | — | — | — | — | — | — | — | — | ${reason} | — |`);
  return lines.join('\n');
}

export function stormTable(results: readonly StormResult[]): string {
  const lines = ['| adapter | arm | processes | handler runs | statuses |', '|---|---|---:|---:|---|'];
  for (const r of results) {
    lines.push(`| ${r.adapter} | ${ARM_LABELS[r.arm]} | ${r.processes} | ${r.handlerRuns} | ${histogram(r.statuses)}${r.errors ? `, ${r.errors} errors` : ''} |`);
  }
  return lines.join('\n');
}

export function crashTable(results: readonly CrashResult[], leaseSeconds: number): string {
  const lines = [
    `| arm | retry at +0 s | retry gets through | in-flight key TTL at the kill | statuses seen | note |`,
    '|---|---:|---|---:|---|---|',
  ];
  for (const r of results) {
    const through = r.throughAfterSeconds === undefined ? `not within ${fmt(r.waitedSeconds, 1)} s` : `at +${fmt(r.throughAfterSeconds, 1)} s`;
    const ttl = r.inFlightTtlMs === undefined ? '—' : `${fmt(r.inFlightTtlMs / 1000, 1)} s`;
    lines.push(`| ${ARM_LABELS[r.arm]} | ${r.retryAtZero} | ${through} | ${ttl} | ${histogram(r.statusesSeen)} | ${r.note ?? ''} |`);
  }
  lines.push('', `Lease of the crash route: ${leaseSeconds} s for this guard and the hand-written one (\`leaseSeconds\`); the peer has no lease: its in-flight record lives its retention (\`cacheTTLMS\`, 24 h).`);
  return lines.join('\n');
}

export interface TargetCheck {
  target: string;
  measured: string;
  met: boolean | undefined;
}

/** The issue's targets, checked against this run. */
export function checkTargets(rows: readonly Row[], fingerprint?: { results: { size: string; mbPerSecond: Record<string, number> }[] }): TargetCheck[] {
  const checks: TargetCheck[] = [];
  const row = (adapter: AdapterName, arm: ArmName, mode: Mode) => rows.find((r) => r.adapter === adapter && r.arm === arm && r.mode === mode);
  const ratio = (adapter: AdapterName, mode: Mode, min: number, what: string) => {
    const r = row(adapter, 'guard-redis', mode);
    checks.push({ target: `${what} ≥ ${min.toFixed(2)} × bare (${adapter})`, measured: fmt(r?.ratioToBare), met: r ? r.ratioToBare >= min : undefined });
  };
  for (const adapter of ['express', 'fastify'] as const) {
    const floor = rows.find((r) => r.adapter === adapter && r.arm === 'empty-interceptor');
    const ofFloor = floor ? ` (an empty interceptor alone: ${fmt(floor.addedCpuMicros, 0)} µs)` : '';
    for (const mode of ['unique', 'replay'] as const) {
      const r = row(adapter, 'guard-redis', mode);
      checks.push({
        target: `Redis guard adds ≤ 20 µs CPU per request (${adapter}, ${mode}; app + Redis − bare)`,
        measured: r ? `${fmt(r.addedCpuMicros, 0)} µs${ofFloor}` : '—',
        met: r ? r.addedCpuMicros <= 20 : undefined,
      });
    }
  }
  ratio('express', 'unique', 0.9, 'Redis guard, unique keys');
  ratio('fastify', 'unique', 0.6, 'Redis guard, unique keys');
  ratio('express', 'replay', 0.95, 'Redis guard, replay');
  ratio('fastify', 'replay', 0.75, 'Redis guard, replay');
  for (const adapter of ['express', 'fastify'] as const) {
    const r = row(adapter, 'guard-redis', 'unique');
    checks.push({ target: `Redis guard p99 ≤ 1.2 × bare (${adapter}, unique)`, measured: fmt(r?.p99RatioToBare), met: r ? r.p99RatioToBare <= 1.2 : undefined });
  }
  for (const [mode, expected] of [['unique', 2], ['replay', 1]] as const) {
    const found = (['express', 'fastify'] as const)
      .map((a) => [a, row(a, 'guard-redis', mode)?.redisSentPerRequest] as const)
      .filter((entry): entry is readonly [AdapterName, number] => entry[1] !== undefined);
    checks.push({
      target: `Redis commands per ${mode === 'unique' ? 'first request' : 'duplicate'} = ${expected}`,
      measured: found.map(([a, v]) => `${fmt(v)} (${a})`).join(', ') || '—',
      met: found.length === 0 ? undefined : found.every(([, v]) => Math.abs(v - expected) < 0.02),
    });
  }
  if (fingerprint) {
    const guard = 'this guard (fingerprintRequest)';
    for (const r of fingerprint.results) {
      const safe = r.mbPerSecond['safe-stable-stringify + SHA-256'];
      checks.push({ target: `fingerprint ≥ safe-stable-stringify at ${r.size}`, measured: `${fmt(r.mbPerSecond[guard], 0)} vs ${fmt(safe, 0)} MB/s`, met: r.mbPerSecond[guard] >= safe });
    }
    const big = fingerprint.results.at(-1)!;
    const plain = big.mbPerSecond['JSON.stringify unsorted + SHA-256'];
    checks.push({ target: `fingerprint at ${big.size} ≥ 0.5 × unsorted JSON.stringify`, measured: `${fmt(big.mbPerSecond[guard] / plain)} ×`, met: big.mbPerSecond[guard] >= 0.5 * plain });
  }
  return checks;
}

export function targetsTable(checks: readonly TargetCheck[]): string {
  const lines = ['| target | measured | met |', '|---|---|---|'];
  for (const c of checks) lines.push(`| ${c.target} | ${c.measured} | ${c.met === undefined ? 'not measured' : c.met ? 'yes' : '**no**'} |`);
  return lines.join('\n');
}
