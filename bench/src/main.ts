import { Redis } from 'ioredis';
import { spawn } from 'node:child_process';
import { mkdir, writeFile } from 'node:fs/promises';
import { cpus, loadavg } from 'node:os';
import { join } from 'node:path';
import { ADAPTERS, DEFAULT_ARMS, UNGUARDED_ARMS, isArmName, type AdapterName, type ArmName } from './arm-names.js';
import { ArmUnavailableError, startArm, startRedis, stopAll, stopAllGracefully, trapExit, type ArmEnvironment, type ArmProcess } from './driver/processes.js';
import { onServerCpus, pinCpus } from './driver/cpu-pinning.js';
import { assertLoadGenerator } from './driver/load.js';
import { Progress } from './driver/progress.js';
import { ArmUnavailable, preparePostgresSchema } from './arms/postgres-arm.js';
import { fingerprintTable, type FingerprintResult } from './micro/fingerprint.bench.js';
import { instructionsTable, instructionsUnavailable, runInstructionsBench, type InstructionsResult } from './micro/instructions.bench.js';
import { interceptorTable, type InProcessRuns } from './micro/interceptor.bench.js';
import type { MemoryOutcome } from './micro/memory-store.bench.js';
import { DIST_BENCH, PROJECT_ROOT, RESULTS_DIR } from './paths.js';
import { BAD_INPUT_CASES, badInputPhase, badInputTable, type BadInputResult } from './phases/bad-input.js';
import { crashPhase, type CrashResult } from './phases/crash.js';
import { stormPhase, type StormResult } from './phases/storm.js';
import { slotsOf, throughputPhase, type Sample } from './phases/throughput.js';
import { checkTargets, crashTable, stormTable, summarise, targetsTable, throughputTable } from './report.js';

/** `--seconds 10` on the command line, else `BENCH_SECONDS=10`, else the default. */
function setting(name: string, fallback: string): string {
  const flag = process.argv.indexOf(`--${name}`);
  if (flag !== -1 && process.argv[flag + 1] !== undefined) return process.argv[flag + 1];
  return process.env[`BENCH_${name.toUpperCase().replace(/-/g, '_')}`] ?? fallback;
}
const list = (value: string) => value.split(',').map((s) => s.trim()).filter(Boolean);

const settings = {
  seconds: Number(setting('seconds', '3')),
  rounds: Number(setting('rounds', '5')),
  /** `auto` pins the load generator and the servers to separate CPUs (`taskset`), `off` does not. */
  pin: setting('pin', 'auto'),
  warmupSeconds: Number(setting('warmup-seconds', '1')),
  connections: Number(setting('connections', '50')),
  crashLeaseSeconds: Number(setting('crash-lease-seconds', '3')),
  phases: new Set(list(setting('phases', 'fingerprint,interceptor,memory,throughput,storm,crash,bad-input'))),
  /** How many times the bad-input phase sends each body. */
  badInputRepeats: Number(setting('bad-input-repeats', '3')),
  adapters: list(setting('adapters', ADAPTERS.join(','))) as AdapterName[],
  arms: list(setting('arms', DEFAULT_ARMS.join(','))),
  databaseUrl: process.env.DATABASE_URL ?? 'postgres://postgres@127.0.0.1:5432/test',
  armNodeFlags: list(setting('arm-node-options', '').replace(/\s+/g, ',')),
  /** Base name of the result files in bench/results/. */
  out: setting('out', 'latest').replace(/[^\w.-]/g, '_'),
};

/** Runs a bench script as its own process and parses the JSON line it prints last. */
function runScript<T>(script: string, args: string[], nodeFlags: string[] = []): Promise<T> {
  return new Promise((resolve, reject) => {
    const child = spawn(...onServerCpus(process.execPath, [...nodeFlags, join(DIST_BENCH, 'micro', script), ...args, '--json']), {
      cwd: PROJECT_ROOT,
      stdio: ['ignore', 'pipe', 'inherit'],
    });
    let out = '';
    child.stdout.on('data', (chunk: Buffer) => (out += chunk.toString()));
    child.once('exit', (code) => {
      if (code !== 0) return reject(new Error(`${script} exited with ${code}`));
      resolve(JSON.parse(out.trim().split('\n').at(-1)!) as T);
    });
  });
}

async function main(): Promise<void> {
  trapExit();
  const cpuPlan = pinCpus(settings.pin);
  for (const arm of settings.arms) if (!isArmName(arm)) throw new Error(`unknown arm "${arm}"`);
  const arms = [...new Set(['bare', ...settings.arms])] as ArmName[];
  const has = (phase: string) => settings.phases.has(phase);
  if (has('throughput') || has('storm') || has('crash')) assertLoadGenerator();
  const progress = new Progress();
  progress.plan(has('fingerprint') ? 1 : 0, 30);
  progress.plan(has('interceptor') ? 1 : 0, 60);
  progress.plan(has('instructions') ? 1 : 0, 520);
  const startedAt = new Date();
  const loadBefore = loadavg();
  progress.log(
    `bench: ${settings.seconds} s × ${settings.rounds} rounds per arm and mode, ${settings.connections} connections, ` +
      `arms ${arms.join(', ')}; ${cpus().length} cores, Node ${process.version}; ${cpuPlan.description}`,
  );

  let fingerprint: { results: FingerprintResult[]; smallBodyMicroseconds: number } | undefined;
  if (has('fingerprint')) {
    progress.show('fingerprint micro-benchmark (alone on the machine)');
    fingerprint = await runScript('fingerprint.bench.js', []);
    progress.step('fingerprint');
  }
  let interceptor: InProcessRuns | undefined;
  if (has('interceptor')) {
    progress.show('interceptor micro-benchmark (alone on the machine)');
    // Again with V8's allocation-site pretenuring off: a closure of its own on each response's
    // end() set it off in this loop, without any guard code (micro/deferred-end.bench.ts). The
    // guard no longer puts closures there (session 10), so the two runs should agree.
    interceptor = {
      asIs: await runScript('interceptor.bench.js', []),
      noPretenuring: await runScript('interceptor.bench.js', [], ['--no-allocation-site-pretenuring']),
    };
    progress.step('interceptor');
  }
  // Opt-in (`--phases instructions`, ~9 minutes): the same arms counted by callgrind, not timed.
  let instructions: InstructionsResult | undefined;
  if (has('instructions')) {
    const reason = instructionsUnavailable();
    if (reason) progress.log(`bench: instructions: ${reason}`);
    else instructions = await runInstructionsBench((arm) => progress.show(`instructions (callgrind): ${arm}`));
    progress.step('instructions');
  }
  const redisProcess = await startRedis();
  const redis = new Redis(redisProcess.url, { maxRetriesPerRequest: 1 });
  const env: ArmEnvironment = {
    redisUrl: redisProcess.url,
    databaseUrl: settings.databaseUrl,
    crashLeaseSeconds: settings.crashLeaseSeconds,
    nodeFlags: settings.armNodeFlags,
  };
  const unavailable = new Map<ArmName, string>();
  const needArms = has('throughput') || has('storm') || has('crash');
  let dropSchema: (() => Promise<void>) | undefined;
  if (needArms && arms.includes('guard-postgres')) {
    const schema = `bench_${Date.now().toString(36)}`;
    try {
      dropSchema = await preparePostgresSchema(settings.databaseUrl, schema);
      env.postgresSchema = schema;
    } catch (error) {
      const reason = error instanceof ArmUnavailable ? error.message : `PostgreSQL at ${settings.databaseUrl}: ${(error as Error).message}`;
      unavailable.set('guard-postgres', reason);
      progress.log(`bench: guard-postgres: ${reason}`);
    }
  }

  /** One instance of every arm per adapter; an arm that cannot start is reported, not fatal. */
  const startInstances = async (adapters: readonly AdapterName[], which: readonly ArmName[] = arms) => {
    const byAdapter = new Map<AdapterName, Map<ArmName, ArmProcess>>();
    for (const adapter of adapters) {
      const started = new Map<ArmName, ArmProcess>();
      for (const arm of which) {
        if (unavailable.has(arm)) continue;
        progress.show(`starting ${arm} on ${adapter}`);
        try {
          started.set(arm, await startArm(arm, adapter, env));
        } catch (error) {
          if (arm === 'bare') throw error;
          const reason = error instanceof ArmUnavailableError ? error.message : `failed to start: ${(error as Error).message.split('\n')[0]}`;
          unavailable.set(arm, reason);
          progress.log(`bench: ${arm} on ${adapter}: ${reason}`);
        }
      }
      byAdapter.set(adapter, started);
    }
    return byAdapter;
  };

  const first = needArms ? await startInstances(settings.adapters) : new Map<AdapterName, Map<ArmName, ArmProcess>>();
  for (const instances of first.values()) for (const arm of unavailable.keys()) instances.delete(arm);
  const running = arms.filter((arm) => !unavailable.has(arm));
  const runs = has('throughput') ? slotsOf(running).length * settings.adapters.length : 0;
  progress.plan(runs, settings.warmupSeconds + 0.6);
  progress.plan(runs * settings.rounds, settings.seconds + 0.6);
  // The floors (the empty and the answering interceptor) are measured for throughput only: they guard nothing.
  const stormArms = running.filter((arm) => !UNGUARDED_ARMS.has(arm) || arm === 'bare');
  progress.plan(has('storm') ? stormArms.length * settings.adapters.length * 2 : 0, 1.5);
  progress.plan(has('crash') ? 1 : 0, settings.crashLeaseSeconds + 8);
  progress.plan(has('memory') ? 1 : 0, 10);
  progress.plan(has('bad-input') ? BAD_INPUT_CASES * settings.adapters.length : 0, settings.badInputRepeats * 0.5);

  let samples: Sample[] = [];
  if (has('throughput')) samples = await throughputPhase(first, redis, settings, progress);

  // Memory only measures bytes and the storm and crash phases count, so they may share the CPU.
  const memory = has('memory')
    ? Promise.all([
        runScript<MemoryOutcome>('memory-store.bench.js', ['1000000'], ['--expose-gc']),
        runScript<MemoryOutcome>('memory-store.bench.js', ['100000'], ['--expose-gc']),
      ]).catch((error: unknown) => {
        progress.log(`bench: memory store benchmark failed: ${(error as Error).message}`);
        return undefined;
      })
    : undefined;

  let storm: StormResult[] = [];
  let crash: CrashResult[] = [];
  if (has('storm') || has('crash')) {
    await redis.flushall();
    const second = await startInstances(settings.adapters, stormArms);
    const pairs = new Map<AdapterName, Map<ArmName, [ArmProcess, ArmProcess]>>();
    for (const [adapter, instances] of first) {
      const pairMap = new Map<ArmName, [ArmProcess, ArmProcess]>();
      for (const [arm, one] of instances) {
        const two = second.get(adapter)?.get(arm);
        if (two) pairMap.set(arm, [one, two]);
      }
      pairs.set(adapter, pairMap);
    }
    if (has('storm')) storm = await stormPhase(pairs, progress);
    if (has('crash')) {
      const survivors = new Map([...(second.get('express') ?? new Map<ArmName, ArmProcess>())].filter(([arm]) => arm !== 'bare'));
      crash = await crashPhase(survivors, env, redis, progress);
    }
  }
  let badInput: BadInputResult[] = [];
  if (has('bad-input')) {
    await redis.flushall();
    badInput = await badInputPhase(settings.adapters, env, settings.badInputRepeats, progress);
  }
  progress.show('memory store: 100k and 1M keys');
  const memoryOutcome = memory ? await memory : undefined;
  if (has('memory')) progress.step('memory store');
  progress.finish();
  redis.disconnect();
  await stopAllGracefully();
  await dropSchema?.().catch((error: unknown) => progress.log(`bench: could not drop the PostgreSQL schema: ${(error as Error).message}`));

  const loadAfter = loadavg();
  const rows = summarise(samples);
  const checks = checkTargets(rows, cpus().length, interceptor);
  const sections: string[] = [
    `# npm run bench — ${startedAt.toISOString()}`,
    '',
    `Node ${process.version}, ${cpus().length} cores, the load generator autocannon (${settings.connections} connections); ${cpuPlan.description}. ` +
      `Each arm is its own process; ${settings.rounds} rounds of ${settings.seconds} s per arm and mode after a ${settings.warmupSeconds} s warm-up, arms interleaved. ` +
      'Medians over rounds; ratios are medians of per-round ratios (same round, same adapter), with the lowest and highest round in brackets. ' +
      'CPU µs/req: CPU time of the arm process (`process.cpuUsage`) + of the store\'s server per request sent (redis-server\'s `INFO cpu`; for the PostgreSQL arm, every `postgres` process in /proc: backends, WAL writer, checkpointer); added = app + store − bare app, the guard\'s cost per request. ' +
      'Redis cmds/req: round trips (counted by the guard arms\' own client; from `INFO commandstats` for arms without scripts), then in brackets the commands run inside Lua scripts (the rest of `INFO commandstats`, reset before each run). ' +
      `Load average (1 min) ${loadBefore[0].toFixed(1)} at the start, ${loadAfter[0].toFixed(1)} at the end: above ~2.5 other work shared the machine and absolute figures are low.`,
  ];
  if (samples.length > 0) sections.push('', '## Throughput', '', throughputTable(rows, unavailable));
  if (checks.length > 0) sections.push('', '## Targets (issue #15)', '', targetsTable(checks));
  if (fingerprint) {
    sections.push('', '## Fingerprint mode (no key), MB/s of JSON body', '', fingerprintTable(fingerprint.results));
    sections.push('', `Per request with this bench's 33-byte body: ${fingerprint.smallBodyMicroseconds.toFixed(2)} µs for the fingerprint.`);
  }
  if (interceptor) {
    sections.push(
      '',
      '## The interceptors\' own code (in-process, no HTTP, no network)',
      '',
      interceptorTable(interceptor),
      '',
      '`intercept()` and the handler\'s Observable to the end, on a ready request, 50,000 calls per round, median of 5 rounds (`micro/interceptor.bench.ts`). ' +
        'The second pair of columns is the same run under `--no-allocation-site-pretenuring`: a closure of its own on each response\'s `end()` (as the guard put until session 10) ' +
        'set off collections that kept megabytes alive in this loop, with no guard code at all (`micro/deferred-end.bench.ts`); with the guard\'s shared methods the two runs agree.',
    );
  }
  if (instructions) {
    sections.push(
      '',
      '## The interceptors\' own code in instructions (callgrind)',
      '',
      instructionsTable(instructions),
      '',
      `The arms above, each under valgrind's callgrind (${instructions.valgrind}, node --single-threaded) for ${instructions.few.toLocaleString('en-US')} and for ` +
        `${instructions.many.toLocaleString('en-US')} calls: the difference of the two counts over the difference of the calls is one call's, start-up and ` +
        'compilation cancelled out (`micro/instructions.bench.ts`). Counts, not time: they do not move with the machine\'s load, but a total moves by up to ~25 % ' +
        'between runs when a major collection falls in one run of a pair and not the other: compare the counts of one builtin or function, or repeat.',
    );
  }
  if (memoryOutcome) {
    sections.push('', '## Memory store', '', '| maxEntries | keys inserted | entries held | heap bytes/entry | heap MB | RSS MB | µs per claim + complete | within bound |', '|---:|---:|---:|---:|---:|---:|---:|---|');
    for (const outcome of memoryOutcome) {
      for (const p of outcome.points) {
        sections.push(`| ${outcome.maxEntries.toLocaleString('en-US')} | ${p.inserted.toLocaleString('en-US')} | ${p.size.toLocaleString('en-US')} | ${Math.round(p.heapBytesPerEntry)} | ${Math.round(p.heapUsedMB)} | ${Math.round(p.rssMB)} | ${p.microsPerInsert.toFixed(1)} | ${outcome.withinBound ? 'yes' : '**no**'} |`);
      }
    }
  }
  if (storm.length > 0) sections.push('', '## Storm: 500 identical requests, 200 at a time', '', stormTable(storm));
  if (crash.length > 0) sections.push('', '## Crash: the first process is killed mid-request, the same request is retried', '', crashTable(crash, settings.crashLeaseSeconds));
  if (badInput.length > 0) sections.push('', '## Bad input: hostile bodies to the demo app, and the event loop meanwhile', '', badInputTable(badInput, settings.badInputRepeats));
  const markdown = `${sections.join('\n')}\n`;

  await mkdir(RESULTS_DIR, { recursive: true });
  const json = { startedAt, cpus: cpuPlan, loadAverage: { before: loadBefore, after: loadAfter }, settings: { ...settings, phases: [...settings.phases] }, node: process.version, cores: cpus().length, rows, checks, samples, fingerprint, interceptor, instructions, memory: memoryOutcome, storm, crash, badInput, unavailable: Object.fromEntries(unavailable) };
  await writeFile(join(RESULTS_DIR, `${settings.out}.json`), `${JSON.stringify(json, null, 2)}\n`);
  await writeFile(join(RESULTS_DIR, `${settings.out}.md`), markdown);
  process.stdout.write(`\n${markdown}\nWritten: bench/results/${settings.out}.md, bench/results/${settings.out}.json\n`);
}

main().catch((error: unknown) => {
  stopAll();
  process.stderr.write(`\nbench failed: ${error instanceof Error ? (error.stack ?? error.message) : String(error)}\n`);
  process.exit(1);
});
