import { execFile } from 'node:child_process';
import { mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { promisify } from 'node:util';
import { freePort, startRedisServer, type RedisServer } from './redis-server.js';

const run = promisify(execFile);

/** A throwaway Redis Cluster of `masters` nodes on loopback ports, stopped by its pids. */
export interface RedisCluster {
  nodes: { host: string; port: number }[];
  stop(): Promise<void>;
}

export async function startRedisCluster(masters = 3): Promise<RedisCluster> {
  const dir = await mkdtemp(join(tmpdir(), 'idempotency-cluster-'));
  const servers: RedisServer[] = [];
  const stop = async () => {
    await Promise.all(servers.map((server) => server.kill()));
    await rm(dir, { recursive: true, force: true });
  };
  try {
    for (let i = 0; i < masters; i++) {
      const port = await freePort();
      servers.push(
        await startRedisServer(port, [
          '--cluster-enabled', 'yes',
          '--cluster-config-file', join(dir, `nodes-${port}.conf`),
          '--cluster-node-timeout', '2000',
        ]),
      );
    }
    await run('redis-cli', [
      '--cluster', 'create', ...servers.map((s) => `127.0.0.1:${s.port}`), '--cluster-replicas', '0', '--cluster-yes',
    ]);
    await waitForClusterOk(servers[0].port);
    return { nodes: servers.map((s) => ({ host: '127.0.0.1', port: s.port })), stop };
  } catch (error) {
    await stop();
    throw error;
  }
}

async function waitForClusterOk(port: number): Promise<void> {
  const deadline = Date.now() + 10_000;
  for (;;) {
    const { stdout } = await run('redis-cli', ['-p', String(port), 'cluster', 'info']);
    if (stdout.includes('cluster_state:ok')) return;
    if (Date.now() > deadline) throw new Error(`Redis Cluster did not become ready: ${stdout}`);
    await new Promise((resolve) => setTimeout(resolve, 100));
  }
}
