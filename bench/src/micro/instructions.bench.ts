import { spawn, spawnSync } from 'node:child_process';
import { join } from 'node:path';
import { pathToFileURL } from 'node:url';
import { DIST_BENCH, PROJECT_ROOT } from '../paths.js';
import { ARM_NAMES, type InProcessArm } from './interceptor.bench.js';

/**
 * The interceptor bench's arms counted in CPU instructions, not timed: each arm runs under
 * valgrind's callgrind (`--single-threaded`, so that V8 compiles and collects on the main thread)
 * for FEW and for MANY calls, and (instructions of MANY − instructions of FEW) / (MANY − FEW) is
 * one call's, start-up and compilation cancelled out. Counts do not move with the machine's load,
 * but a total moves between runs by up to ~25 % when a major collection falls in one run of a
 * pair and not the other (session 37: the peer's replay arm read 31,273 and 51,844 in two runs of
 * one code). Compare the counts of one builtin or function (`callgrind_annotate` on an output
 * file, `--perf-basic-prof` to name JavaScript's), or repeat a run. Needs valgrind on the PATH.
 * `node dist/bench/src/micro/instructions.bench.js [--json]`.
 */

const FEW = 5_000;
const MANY = 25_000;

export interface InstructionsResult {
  /** Instructions per call, by arm (the floor is an empty interceptor). */
  perCall: Partial<Record<InProcessArm, number>>;
  few: number;
  many: number;
  valgrind: string;
}

/** Why the phase cannot run here, or undefined. */
export function instructionsUnavailable(): string | undefined {
  const probe = spawnSync('valgrind', ['--version'], { encoding: 'utf8' });
  return probe.status === 0 ? undefined : 'valgrind is not on the PATH (Debian: apt-get install valgrind)';
}

/** Instructions callgrind counted for `calls` calls of `arm`, start-up included; undefined where the arm cannot run (the peer not installed). */
function countRun(arm: InProcessArm, calls: number): Promise<number | undefined> {
  const args = [
    '--tool=callgrind',
    '--callgrind-out-file=/dev/null',
    process.execPath,
    '--single-threaded',
    join(DIST_BENCH, 'micro', 'interceptor.bench.js'),
    '--arm',
    arm,
    String(calls),
  ];
  return new Promise((resolve, reject) => {
    const child = spawn('valgrind', args, { cwd: PROJECT_ROOT, stdio: ['ignore', 'ignore', 'pipe'] });
    let err = '';
    child.stderr.on('data', (chunk: Buffer) => (err += chunk.toString()));
    child.once('exit', (code) => {
      const collected = /Collected : (\d+)/.exec(err);
      if (code === 3) return resolve(undefined);
      if (code !== 0 || !collected) return reject(new Error(`callgrind of ${arm} (${calls} calls) exited with ${code}: ${err.slice(-400)}`));
      resolve(Number(collected[1]));
    });
  });
}

export async function runInstructionsBench(onArm: (arm: InProcessArm) => void = () => undefined): Promise<InstructionsResult> {
  const perCall: InstructionsResult['perCall'] = {};
  for (const arm of ARM_NAMES) {
    onArm(arm);
    // The two runs of an arm side by side: callgrind runs each on one core, and counts the same whatever else runs.
    const [few, many] = await Promise.all([countRun(arm, FEW), countRun(arm, MANY)]);
    if (few !== undefined && many !== undefined) perCall[arm] = Math.round((many - few) / (MANY - FEW));
  }
  const valgrind = spawnSync('valgrind', ['--version'], { encoding: 'utf8' }).stdout.trim();
  return { perCall, few: FEW, many: MANY, valgrind };
}

export function instructionsTable({ perCall }: InstructionsResult): string {
  const floor = perCall.floor;
  const cell = (arm: InProcessArm) => (perCall[arm] === undefined ? '—' : perCall[arm]!.toLocaleString('en-US'));
  const above = (arm: InProcessArm) =>
    perCall[arm] === undefined || floor === undefined ? '—' : (perCall[arm]! - floor).toLocaleString('en-US');
  const row = (label: string, unique: InProcessArm, replay: InProcessArm) =>
    `| ${label} | ${cell(unique)} | ${above(unique)} | ${cell(replay)} | ${above(replay)} |`;
  return [
    '| instructions per call | first request | above the floor | replay | above the floor |',
    '|---|---:|---:|---:|---:|',
    `| an empty interceptor (the floor) | ${cell('floor')} | — | ${cell('floor')} | — |`,
    row('this guard, a store that answers at once', 'guard-unique', 'guard-replay'),
    row('this guard, its memory store', 'guard-memory-unique', 'guard-memory-replay'),
    row('@node-idempotency/nestjs (its memory adapter)', 'peer-unique', 'peer-replay'),
  ].join('\n');
}

if (import.meta.url === pathToFileURL(process.argv[1]).href) {
  const unavailable = instructionsUnavailable();
  if (unavailable) throw new Error(unavailable);
  const result = await runInstructionsBench((arm) => process.stderr.write(`callgrind: ${arm}\n`));
  if (process.argv.includes('--json')) process.stdout.write(`${JSON.stringify(result)}\n`);
  else process.stdout.write(`${instructionsTable(result)}\n`);
}
