import { spawn, type ChildProcess } from 'node:child_process';
import { fileURLToPath } from 'node:url';
import { freePort } from './redis-server.js';

const ROOT = fileURLToPath(new URL('../..', import.meta.url));

/** The demo app as a real child process (TypeScript sources through ts-register.mjs, no build). */
export interface DemoProcess {
  baseUrl: string;
  process: ChildProcess;
  /** The last 4,000 characters the process wrote to stderr. */
  stderr(): string;
  /** Sends `signal` (default SIGTERM) and waits for the exit. */
  stop(signal?: NodeJS.Signals): Promise<void>;
}

export async function startDemoProcess(env: Record<string, string>): Promise<DemoProcess> {
  const port = await freePort();
  const child = spawn(
    process.execPath,
    ['--import', './test/support/ts-register.mjs', 'apps/demo/src/main.ts'],
    { cwd: ROOT, env: { ...process.env, ...env, PORT: String(port), HOST: '127.0.0.1' }, stdio: ['ignore', 'ignore', 'pipe'] },
  );
  let stderr = '';
  child.stderr!.on('data', (chunk: Buffer) => (stderr = (stderr + chunk.toString()).slice(-4000)));
  const exited = new Promise<void>((resolve) => child.once('exit', () => resolve()));
  const baseUrl = `http://127.0.0.1:${port}`;
  const stop = async (signal: NodeJS.Signals = 'SIGTERM') => {
    if (child.exitCode === null && child.signalCode === null) child.kill(signal);
    await exited;
  };
  const deadline = Date.now() + 30_000;
  for (;;) {
    if (child.exitCode !== null) throw new Error(`the demo process exited during start-up:\n${stderr}`);
    try {
      await fetch(`${baseUrl}/orders/-`);
      return { baseUrl, process: child, stop, stderr: () => stderr };
    } catch {
      if (Date.now() > deadline) {
        await stop('SIGKILL');
        throw new Error(`the demo process did not answer within 30 s:\n${stderr}`);
      }
      await new Promise((resolve) => setTimeout(resolve, 100));
    }
  }
}
