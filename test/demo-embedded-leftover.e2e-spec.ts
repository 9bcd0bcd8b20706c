// `npm start` without DATABASE_URL runs an embedded PostgreSQL as a child of the demo. A demo
// killed with kill -9 (or a crash) leaves that server running with its lock file: every later
// start failed with "lock file postmaster.pid already exists" and nothing said what to do (an
// adversarial helper). The next start stops the server the killed demo left, and starts anew.
import { describe, expect, it } from '@jest/globals';
import { spawn } from 'node:child_process';
import { chmod, mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join, resolve } from 'node:path';
import pg from 'pg';
import { startEmbeddedDatabase } from '../apps/demo/src/embedded-database.js';
import { freePort } from './support/redis-server.js';

const ROOT = resolve(import.meta.dirname, '..');

describe('the embedded database of a demo that was killed', () => {
  it('is stopped by the next start, which then runs', async () => {
    const dir = await mkdtemp(join(tmpdir(), 'demo-embedded-'));
    await chmod(dir, 0o755); // as root, PostgreSQL runs as the user postgres, which must enter it
    const dataDir = join(dir, 'pg');
    const port = await freePort();
    // The killed demo: starts the database, says so, and is then killed with SIGKILL.
    const script = `import { startEmbeddedDatabase } from ${JSON.stringify(join(ROOT, 'apps/demo/src/embedded-database.ts'))};
      const db = await startEmbeddedDatabase({ dataDir: ${JSON.stringify(dataDir)}, port: ${port} });
      console.log('ready ' + db.url);
      setInterval(() => undefined, 1000);`;
    const demo = spawn(process.execPath, ['--import', join(ROOT, 'test/support/ts-register.mjs'), '--input-type=module', '-e', script], {
      cwd: ROOT,
      stdio: ['ignore', 'pipe', 'pipe'],
    });
    let output = '';
    demo.stdout!.on('data', (chunk: Buffer) => (output += chunk.toString()));
    demo.stderr!.on('data', (chunk: Buffer) => (output += chunk.toString()));
    let database: Awaited<ReturnType<typeof startEmbeddedDatabase>> | undefined;
    try {
      await new Promise<void>((done, fail) => {
        const timer = setTimeout(() => fail(new Error(`the first demo did not start its database:\n${output}`)), 90_000);
        demo.stdout!.on('data', () => output.includes('ready ') && (clearTimeout(timer), done()));
        demo.once('exit', () => fail(new Error(`the first demo exited:\n${output}`)));
      });
      demo.kill('SIGKILL');
      await new Promise((done) => demo.once('exit', done));

      database = await startEmbeddedDatabase({ dataDir, port });
      const client = new pg.Client({ connectionString: database.url });
      await client.connect();
      const [row] = (await client.query('SELECT 1 AS one')).rows as { one: number }[];
      await client.end();
      expect(row).toEqual({ one: 1 });
    } finally {
      if (demo.exitCode === null && demo.signalCode === null) demo.kill('SIGKILL');
      await database?.stop();
      await rm(dir, { recursive: true, force: true });
    }
  }, 180_000);
});
