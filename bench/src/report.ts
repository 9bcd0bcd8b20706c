import { ARM_LABELS, REDIS_ARMS, type AdapterName, type ArmName } from './arm-names.js';
import { addCounts, histogram, median } from './driver/stats.js';
import type { CrashResult } from './phases/crash.js';
import type { StormResult } from './phases/storm.js';
import type { Mode, Sample } from './phases/throughput.js';

export interface Row {
  adapter: AdapterName;
  arm: ArmName;
  mode: Mode | 'baseline' | 'floor' | 'replay floor';
  rounds: number;
  rps: number;
  p50: number;
  p99: number;
  /** Median over rounds of (arm ÷ bare of the same round and adapter). */
  ratioToBare: number;
  /** The lowest and highest round of `ratioToBare`: the spread the median hides. */
  ratioToBareRange: [number, number];
  p99RatioToBare: number;
  /** Median over rounds of (arm ÷ the peer in the same round, adapter and mode). */
  ratioToPeer?: number;
  ratioToPeerRange?: [number, number];
  redisSentPerRequest?: number;
  redisInScriptPerRequest?: number;
  /** CPU per request sent, microseconds: the arm's process, and the store's server (redis-server, or PostgreSQL's processes). */
  appCpuMicros: number;
  storeCpuMicros?: number;
  /** (app + store CPU) − bare's app CPU, same round and adapter, median: what the guard adds. */
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
    const perRound = (of: (s: Sample) => number, base: (s: Sample) => Sample | undefined) =>
      group.map((s) => { const b = base(s); return b ? of(s) / of(b) : Number.NaN; });
    const ratios = (of: (s: Sample) => number, base: (s: Sample) => Sample | undefined) => median(perRound(of, base));
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
      mode: arm === 'bare' ? 'baseline' : arm === 'empty-interceptor' ? 'floor' : arm === 'answering-interceptor' ? 'replay floor' : mode,
      rounds: group.length,
      rps: median(group.map((s) => s.rps)),
      p50: median(group.map((s) => s.p50)),
      p99: median(group.map((s) => s.p99)),
      ratioToBare: ratios((s) => s.rps, bare),
      ratioToBareRange: range(perRound((s) => s.rps, bare)),
      appCpuMicros: median(group.map((s) => s.appCpuMicrosPerRequest)),
      storeCpuMicros: group.some((s) => s.storeCpuMicrosPerRequest !== undefined)
        ? median(group.map((s) => s.storeCpuMicrosPerRequest ?? Number.NaN))
        : undefined,
      addedCpuMicros: median(
        group.map((s) => {
          const b = bare(s);
          return b ? s.appCpuMicrosPerRequest + (s.storeCpuMicrosPerRequest ?? 0) - b.appCpuMicrosPerRequest : Number.NaN;
        }),
      ),
      p99RatioToBare: ratios((s) => s.p99, bare),
      statuses,
      errors: group.reduce((sum, s) => sum + s.errors, 0),
      handlerRunsPerRequest: group.reduce((sum, s) => sum + s.handlerRuns, 0) / sent,
      requests,
    };
    if (arm !== 'bare' && group.some((s) => peer(s))) {
      row.ratioToPeer = ratios((s) => s.rps, peer);
      row.ratioToPeerRange = range(perRound((s) => s.rps, peer));
    }
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

/** The lowest and highest finite value. */
function range(values: readonly number[]): [number, number] {
  const finite = values.filter((v) => Number.isFinite(v));
  return finite.length === 0 ? [Number.NaN, Number.NaN] : [Math.min(...finite), Math.max(...finite)];
}

const fmt = (value: number | undefined, digits = 2) => (value === undefined || !Number.isFinite(value) ? '—' : value.toFixed(digits));
const int = (value: number) => Math.round(value).toLocaleString('en-US');
/** `0.61 (0.55–0.66)`: a median with its lowest and highest round. */
const spread = (value: number | undefined, bounds: [number, number] | undefined) =>
  value === undefined || !Number.isFinite(value) ? '—' : bounds && Number.isFinite(bounds[0]) ? `${fmt(value)} (${fmt(bounds[0])}–${fmt(bounds[1])})` : fmt(value);

export function throughputTable(rows: readonly Row[], unavailable: ReadonlyMap<ArmName, string>): string {
  const lines = [
    '| adapter | arm | keys | req/s | p50 ms | p99 ms | × bare | p99 × bare | × peer | CPU µs/req app + store | added µs/req | Redis cmds/req (in-script) | statuses | handler runs/req |',
    '|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---|---|---:|',
  ];
  for (const r of rows) {
    const redis = r.redisSentPerRequest === undefined ? '—' : `${fmt(r.redisSentPerRequest)} (${fmt(r.redisInScriptPerRequest, 1)})`;
    lines.push(
      `| ${r.adapter} | ${ARM_LABELS[r.arm]} | ${r.mode} | ${int(r.rps)} | ${fmt(r.p50)} | ${fmt(r.p99)} | ${r.arm === 'bare' ? '1.00' : spread(r.ratioToBare, r.ratioToBareRange)} | ${fmt(r.p99RatioToBare)} | ${spread(r.ratioToPeer, r.ratioToPeerRange)} | ${fmt(r.appCpuMicros, 0)}${r.storeCpuMicros === undefined ? '' : ` + ${fmt(r.storeCpuMicros, 0)}`} | ${r.arm === 'bare' ? '—' : fmt(r.addedCpuMicros, 0)} | ${redis} | ${histogram(r.statuses)}${r.errors ? `, ${r.errors} errors` : ''} | ${fmt(r.handlerRunsPerRequest, 3)} |`,
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

/** What the in-process micro-benchmark measured, in ns per call (see `micro/interceptor.bench.ts`). */
interface InProcess {
  emptyInterceptor: number;
  guardUnique: number;
  guardReplay: number;
}

/** Issue #15's targets, checked against this run. */
export function checkTargets(rows: readonly Row[], cores: number, inProcess?: { asIs: InProcess; noPretenuring: InProcess }): TargetCheck[] {
  const checks: TargetCheck[] = [];
  const row = (adapter: AdapterName, arm: ArmName, mode: Mode) => rows.find((r) => r.adapter === adapter && r.arm === arm && r.mode === mode);
  const atLeast = (target: string, value: number | undefined, bounds: [number, number] | undefined, min: number) =>
    checks.push({ target, measured: value === undefined ? '—' : spread(value, bounds), met: value === undefined || !Number.isFinite(value) ? undefined : value >= min });
  for (const adapter of ['express', 'fastify'] as const) {
    const unique = row(adapter, 'guard-redis', 'unique');
    atLeast(`Redis store, unique keys ≥ 1.10 × the peer (${adapter})`, unique?.ratioToPeer, unique?.ratioToPeerRange, 1.1);
  }
  for (const [adapter, min] of [['express', 0.95], ['fastify', 0.8]] as const) {
    const cached = row(adapter, 'guard-redis-local-cache', 'replay');
    const target = `replays, local cache on ≥ ${min.toFixed(2)} × bare (${adapter})`;
    atLeast(target, cached?.ratioToBare, cached?.ratioToBareRange, min);
    // What no interceptor's replay can beat: Nest's pipeline and the adapter's send alone.
    const floor = rows.find((r) => r.adapter === adapter && r.arm === 'answering-interceptor');
    if (cached && floor) checks.find((c) => c.target === target)!.measured += ` (the replay floor, an interceptor answering without the handler: ${spread(floor.ratioToBare, floor.ratioToBareRange)})`;
    atLeast(`replays, local cache on ≥ 1.30 × the peer (${adapter})`, cached?.ratioToPeer, cached?.ratioToPeerRange, 1.3);
  }
  const perReplay = (['express', 'fastify'] as const)
    .map((a) => [a, row(a, 'guard-redis', 'replay')?.redisSentPerRequest] as const)
    .filter((entry): entry is readonly [AdapterName, number] => entry[1] !== undefined);
  checks.push({
    target: 'without the cache, one Redis command per replay',
    measured: perReplay.map(([a, v]) => `${fmt(v)} (${a})`).join(', ') || '—',
    met: perReplay.length === 0 ? undefined : perReplay.every(([, v]) => Math.abs(v - 1) < 0.02),
  });
  for (const adapter of ['express', 'fastify'] as const) {
    const postgres = row(adapter, 'guard-postgres', 'unique');
    const redis = row(adapter, 'guard-redis', 'unique');
    const ofRedis = postgres && redis ? postgres.ratioToBare / redis.ratioToBare : undefined;
    const target = `PostgreSQL store (pool 20), unique keys ≥ 0.5 × the Redis store (${adapter})`;
    atLeast(target, ofRedis, undefined, 0.5);
    // What the machine could do at all at this CPU per request (the app and PostgreSQL, nothing
    // for the load generator): the target needs half the Redis arm's rate.
    const perRequest = postgres ? postgres.appCpuMicros + (postgres.storeCpuMicros ?? Number.NaN) : Number.NaN;
    if (redis && Number.isFinite(perRequest)) {
      const check = checks.find((c) => c.target === target)!;
      check.measured += ` (${int(perRequest)} µs of CPU a request, app ${int(postgres!.appCpuMicros)} + PostgreSQL ${int(postgres!.storeCpuMicros!)}: ${cores} cores could serve at most ${int((cores * 1e6) / perRequest)} req/s; the target needs ${int(redis.rps / 2)})`;
    }
    checks.push({ target: `PostgreSQL store, unique keys ≥ the peer's PostgreSQL adapter (${adapter})`, measured: 'no peer PostgreSQL arm yet', met: undefined });
  }
  if (inProcess) {
    // Its own code: the guard's arm above the floor (an empty interceptor on the same harness).
    const own = (run: InProcess, mode: 'guardUnique' | 'guardReplay') => run[mode] - run.emptyInterceptor;
    const micros = (ns: number) => `${(ns / 1000).toFixed(2)} µs`;
    for (const [mode, limit, what] of [['guardUnique', 3000, 'first request'], ['guardReplay', 2000, 'replay']] as const) {
      const asIs = own(inProcess.asIs, mode);
      checks.push({
        target: `the guard's own code ≤ ${limit / 1000} µs per ${what} (in-process, above the floor)`,
        measured: `${micros(asIs)} (no pretenuring: ${micros(own(inProcess.noPretenuring, mode))})`,
        met: asIs <= limit,
      });
    }
  }
  return checks;
}

export function targetsTable(checks: readonly TargetCheck[]): string {
  const lines = ['| target | measured | met |', '|---|---|---|'];
  for (const c of checks) lines.push(`| ${c.target} | ${c.measured} | ${c.met === undefined ? 'not measured' : c.met ? 'yes' : '**no**'} |`);
  return lines.join('\n');
}
