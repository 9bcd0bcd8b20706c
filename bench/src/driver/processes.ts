import { spawn, type ChildProcess } from 'node:child_process';
import { createServer } from 'node:net';
import { join } from 'node:path';
import type { AdapterName, ArmName } from '../arm-names.js';
import { DIST_BENCH, PROJECT_ROOT } from '../paths.js';
import { onServerCpus } from './cpu-pinning.js';

/** A free loopback TCP port (bound, then released). */
export async function freePort(): Promise<number> {
  const server = createServer();
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  const { port } = server.address() as { port: number };
  await new Promise((resolve) => server.close(resolve));
  return port;
}

const started = new Set<ChildProcess>();

/** SIGKILLs every process the bench started, by its own pid; safe to call more than once. */
export function stopAll(): void {
  for (const child of started) {
    if (child.exitCode === null && child.signalCode === null && child.pid !== undefined) {
      try {
        process.kill(child.pid, 'SIGKILL');
      } catch {
        // already gone
      }
    }
  }
  started.clear();
}

/**
 * SIGTERM first (arms then exit normally, so `--cpu-prof` writes its profile), SIGKILL whatever
 * is still running after `graceMs`.
 */
export async function stopAllGracefully(graceMs = 5000): Promise<void> {
  const running = [...started].filter((child) => child.exitCode === null && child.signalCode === null);
  await Promise.all(
    running.map(
      (child) =>
        new Promise<void>((resolve) => {
          const timer = setTimeout(resolve, graceMs);
          child.once('exit', () => {
            clearTimeout(timer);
            resolve();
          });
          child.kill('SIGTERM');
        }),
    ),
  );
  stopAll();
}

let trapped = false;
/** Stops every started process on exit, Ctrl-C, SIGTERM and crashes of the driver. */
export function trapExit(): void {
  if (trapped) return;
  trapped = true;
  process.on('exit', stopAll);
  for (const signal of ['SIGINT', 'SIGTERM', 'SIGHUP'] as const) {
    process.once(signal, () => {
      stopAll();
      process.stderr.write(`\nbench: stopped by ${signal}; every process it started was killed\n`);
      process.exit(130);
    });
  }
}

export interface Started {
  child: ChildProcess;
  /** SIGKILL and wait until the process is gone. */
  kill(): Promise<void>;
  /** What the process wrote, for error messages. */
  output(): string;
}

function track(child: ChildProcess, name: string): Started {
  started.add(child);
  let output = '';
  const keep = (chunk: Buffer) => {
    output = (output + chunk.toString()).slice(-4000);
  };
  child.stdout?.on('data', keep);
  child.stderr?.on('data', keep);
  const exited = new Promise<void>((resolve) => child.once('exit', () => resolve()));
  child.once('exit', () => started.delete(child));
  child.once('error', (error) => (output += `\n${name}: ${error.message}`));
  return {
    child,
    output: () => output,
    async kill() {
      if (child.exitCode === null && child.signalCode === null) child.kill('SIGKILL');
      await exited;
    },
  };
}

/** Waits for a line matching `ready` (or the process's exit) for at most `timeoutMs`. */
function waitForLine(proc: Started, ready: RegExp, timeoutMs: number, name: string): Promise<string> {
  return new Promise((resolve, reject) => {
    const timer = setTimeout(() => fail(new Error(`${name} did not start within ${timeoutMs} ms:\n${proc.output()}`)), timeoutMs);
    const onData = () => {
      const match = ready.exec(proc.output());
      if (match) done(() => resolve(match[0]));
    };
    const onExit = (code: number | null) => fail(new Error(`${name} exited (${code}) before it was ready:\n${proc.output()}`));
    const done = (then: () => void) => {
      clearTimeout(timer);
      proc.child.stdout?.off('data', onData);
      proc.child.off('exit', onExit);
      then();
    };
    const fail = (error: Error) => done(() => reject(error));
    proc.child.stdout?.on('data', onData);
    proc.child.once('exit', onExit);
    onData();
  });
}

export interface RedisProcess extends Started {
  url: string;
  port: number;
}

/** The bench's own redis-server on a spare loopback port: no persistence, stopped by pid. */
export async function startRedis(): Promise<RedisProcess> {
  const port = await freePort();
  const child = spawn(
    ...onServerCpus('redis-server', ['--port', String(port), '--bind', '127.0.0.1', '--save', '', '--appendonly', 'no', '--loglevel', 'notice']),
    { stdio: ['ignore', 'pipe', 'pipe'] },
  );
  const proc = track(child, 'redis-server');
  // redis-server logs "Ready to accept connections" on stdout.
  await waitForLine(proc, /Ready to accept connections/, 10_000, `redis-server on port ${port}`);
  return { ...proc, url: `redis://127.0.0.1:${port}`, port };
}

export interface ArmProcess extends Started {
  arm: ArmName;
  adapter: AdapterName;
  port: number;
  url: string;
}

export interface ArmEnvironment {
  redisUrl: string;
  databaseUrl: string;
  /** Schema of the PostgreSQL arm (created by the driver), when that arm runs. */
  postgresSchema?: string;
  crashLeaseSeconds: number;
  /** Extra node flags (e.g. `--cpu-prof`) for every arm, from `BENCH_ARM_NODE_OPTIONS`. */
  nodeFlags: string[];
}

/** Thrown when an arm reports that it cannot run yet (e.g. the PostgreSQL store is not written). */
export class ArmUnavailableError extends Error {
  override name = 'ArmUnavailableError';
}

/** Starts one arm as its own process and waits until it listens. */
export async function startArm(
  arm: ArmName,
  adapter: AdapterName,
  env: ArmEnvironment,
  extraEnv: Record<string, string> = {},
): Promise<ArmProcess> {
  const port = await freePort();
  const child = spawn(...onServerCpus(process.execPath, [...env.nodeFlags, join(DIST_BENCH, 'arms', 'arm-server.js')]), {
    cwd: PROJECT_ROOT,
    stdio: ['ignore', 'pipe', 'pipe'],
    env: {
      ...process.env,
      ARM: arm,
      ADAPTER: adapter,
      PORT: String(port),
      REDIS_URL: env.redisUrl,
      DATABASE_URL: env.databaseUrl,
      ...(env.postgresSchema ? { PG_SCHEMA: env.postgresSchema } : {}),
      CRASH_LEASE_SECONDS: String(env.crashLeaseSeconds),
      NODE_ENV: 'production',
      ...extraEnv,
    },
  });
  const proc = track(child, `${arm}/${adapter}`);
  const line = await waitForLine(proc, /(READY \d+|UNAVAILABLE .*)/, 30_000, `arm ${arm} on ${adapter}`);
  if (line.startsWith('UNAVAILABLE')) {
    await proc.kill();
    throw new ArmUnavailableError(line.slice('UNAVAILABLE '.length));
  }
  return { ...proc, arm, adapter, port, url: `http://127.0.0.1:${port}` };
}

export interface DemoProcess extends Started {
  adapter: AdapterName;
  url: string;
  /** Sends `message` over IPC and resolves with the next message of type `answerType`. */
  ask<T>(message: { type: string }, answerType: string): Promise<T>;
}

/** Starts the demo app (`arms/demo-server.ts`) as its own process, with an IPC channel, and waits until it listens. */
export async function startDemo(adapter: AdapterName, env: ArmEnvironment, keyPrefix: string): Promise<DemoProcess> {
  const port = await freePort();
  const child = spawn(...onServerCpus(process.execPath, [...env.nodeFlags, join(DIST_BENCH, 'arms', 'demo-server.js')]), {
    cwd: PROJECT_ROOT,
    stdio: ['ignore', 'pipe', 'pipe', 'ipc'],
    env: {
      ...process.env,
      ADAPTER: adapter,
      PORT: String(port),
      REDIS_URL: env.redisUrl,
      DATABASE_URL: env.databaseUrl,
      KEY_PREFIX: keyPrefix,
      NODE_ENV: 'production',
    },
  });
  const proc = track(child, `demo/${adapter}`);
  await waitForLine(proc, /READY \d+/, 30_000, `the demo app on ${adapter}`);
  const ask = <T>(message: { type: string }, answerType: string) =>
    new Promise<T>((resolve) => {
      const onMessage = (answer: { type?: string }) => {
        if (answer.type !== answerType) return;
        child.off('message', onMessage);
        resolve(answer as T);
      };
      child.on('message', onMessage);
      child.send(message);
    });
  return { ...proc, adapter, url: `http://127.0.0.1:${port}`, ask };
}

export interface HandlerRunCounts {
  pid: number;
  /** CPU time the arm process used so far (user + system), microseconds. */
  cpuMicros: number;
  orders: number;
  storms: number;
  crashes: number;
  /** Commands the guard's Redis client sent so far (guard arms with a Redis store). */
  redisCommands?: number;
}

/** The handler runs an arm counted so far (its unguarded `GET /bench/stats`). */
export async function handlerRuns(arm: { url: string }): Promise<HandlerRunCounts> {
  const response = await fetch(`${arm.url}/bench/stats`);
  return (await response.json()) as HandlerRunCounts;
}
