import { spawn, type ChildProcess } from 'node:child_process';
import { mkdtemp, rm } from 'node:fs/promises';
import { createServer } from 'node:net';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { connectRedis } from './services.js';

/** A free loopback TCP port (bound, then released). */
export async function freePort(): Promise<number> {
  const server = createServer();
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  const { port } = server.address() as { port: number };
  await new Promise((resolve) => server.close(resolve));
  return port;
}

/** A throwaway redis-server on a loopback port, stopped by its own pid. */
export interface RedisServer {
  port: number;
  url: string;
  process: ChildProcess;
  /** SIGKILL, and wait for the process to exit. */
  kill(): Promise<void>;
}

export async function startRedisServer(port?: number, extraArgs: string[] = []): Promise<RedisServer> {
  const chosen = port ?? (await freePort());
  // Its own folder: a replica writes the RDB of a full sync to disk even with --save ''.
  const dir = await mkdtemp(join(tmpdir(), 'idempotency-redis-'));
  const child = spawn(
    'redis-server',
    ['--port', String(chosen), '--bind', '127.0.0.1', '--save', '', '--appendonly', 'no', '--dir', dir, ...extraArgs],
    { stdio: 'ignore' },
  );
  const exited = new Promise<void>((resolve) =>
    child.once('exit', () => void rm(dir, { recursive: true, force: true }).finally(resolve)),
  );
  const url = `redis://127.0.0.1:${chosen}`;
  const deadline = Date.now() + 5000;
  for (;;) {
    try {
      (await connectRedis(url)).disconnect();
      break;
    } catch (error) {
      if (Date.now() > deadline) {
        child.kill('SIGKILL');
        throw error;
      }
      await new Promise((resolve) => setTimeout(resolve, 50));
    }
  }
  return {
    port: chosen,
    url,
    process: child,
    async kill() {
      if (child.exitCode === null && child.signalCode === null) child.kill('SIGKILL');
      await exited;
    },
  };
}
