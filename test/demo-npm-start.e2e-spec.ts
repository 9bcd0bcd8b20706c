// `npm start` stopped as a process manager or a container without an init stops it: SIGTERM to
// the npm process. It ran `nest start demo`, which npm started through `sh -c`: npm passed the
// signal to that shell, the shell died, and the Nest CLI and the demo under it kept serving (an
// adversarial helper). Now the script builds, then `exec`s the app, so npm's child is the app
// itself, and SIGTERM drains and stops it.
import { describe, expect, it } from '@jest/globals';
import { spawn } from 'node:child_process';
import { resolve } from 'node:path';
import { DATABASE_URL } from './support/services.js';

const ROOT = resolve(import.meta.dirname, '..');

/** Whether any process of group `pgid` is still there. */
const groupAlive = (pgid: number) => {
  try {
    process.kill(-pgid, 0);
    return true;
  } catch {
    return false;
  }
};

describe('npm start', () => {
  it('stops the demo when npm gets SIGTERM: nothing of it keeps running', async () => {
    const npm = spawn('npm', ['start'], {
      cwd: ROOT,
      env: { ...process.env, DATABASE_URL, PORT: '0', HOST: '127.0.0.1' },
      detached: true, // a process group of its own, as a service manager gives it
      stdio: ['ignore', 'pipe', 'pipe'],
    });
    let output = '';
    npm.stdout!.on('data', (chunk: Buffer) => (output += chunk.toString()));
    npm.stderr!.on('data', (chunk: Buffer) => (output += chunk.toString()));
    try {
      const url = await new Promise<string>((done, fail) => {
        const timer = setTimeout(() => fail(new Error(`not listening after 120 s:\n${output}`)), 120_000);
        const look = () => {
          const match = /listening on (http:\/\/\S+)/.exec(output);
          if (match) {
            clearTimeout(timer);
            done(match[1]!);
          }
        };
        npm.stdout!.on('data', look);
        npm.stderr!.on('data', look);
      });
      expect((await fetch(`${url}/health`)).status).toBe(200);
      process.kill(npm.pid!, 'SIGTERM');
      const deadline = Date.now() + 20_000;
      while (groupAlive(npm.pid!) && Date.now() < deadline) await new Promise((next) => setTimeout(next, 100));
      expect({ stillRunning: groupAlive(npm.pid!) }).toEqual({ stillRunning: false });
      await expect(fetch(`${url}/health`)).rejects.toThrow();
    } finally {
      if (groupAlive(npm.pid!)) process.kill(-npm.pid!, 'SIGKILL');
    }
  }, 180_000);
});
