import { spawnSync } from 'node:child_process';
import { availableParallelism } from 'node:os';

/**
 * Which CPUs the load generator and the servers under test run on (`taskset`), so that they stop
 * taking each other's time slices and ratios stop moving between rounds. The load generator (this
 * process, autocannon in-process) gets CPU 0; the arms and redis-server get the rest. PostgreSQL
 * is a service the bench does not start, so it is not pinned.
 */
export interface CpuPlan {
  /** `taskset -c` lists. */
  loadGenerator: string;
  servers: string;
  /** One line for the report. */
  description: string;
}

let plan: CpuPlan | { description: string } = { description: 'not pinned' };

/**
 * `auto`: pins this process and the servers started after it when `taskset` exists and the
 * machine has two CPUs or more; `off`: never. Returns the plan, for the report.
 */
export function pinCpus(mode: string): CpuPlan | { description: string } {
  plan = choose(mode);
  return plan;
}

function choose(mode: string): CpuPlan | { description: string } {
  if (mode === 'off') return { description: 'not pinned (BENCH_PIN=off): the load generator, the arms and Redis share every CPU' };
  const cpus = availableParallelism();
  if (cpus < 2) return { description: `not pinned: ${cpus} CPU` };
  if (spawnSync('taskset', ['--version'], { stdio: 'ignore' }).status !== 0) {
    return { description: 'not pinned: `taskset` is missing (util-linux)' };
  }
  const servers = cpus === 2 ? '1' : `1-${cpus - 1}`;
  // -a: every thread of this process (libuv's pool, V8's helpers), not only the main one.
  const pinned = spawnSync('taskset', ['-a', '-cp', '0', String(process.pid)], { stdio: 'ignore' });
  if (pinned.status !== 0) return { description: 'not pinned: `taskset` could not set this process\'s affinity' };
  return {
    loadGenerator: '0',
    servers,
    description: `pinned with taskset: the load generator (autocannon, in the driver) on CPU 0; the arms and redis-server on CPU ${servers}; PostgreSQL unpinned`,
  };
}

/** `[command, args]` run on the servers' CPUs when the plan pins them. */
export function onServerCpus(command: string, args: string[]): [string, string[]] {
  return 'servers' in plan ? ['taskset', ['-c', plan.servers, command, ...args]] : [command, args];
}
