// `npm start` as root from a checkout other users cannot enter (a home directory, `mktemp -d`):
// the embedded PostgreSQL runs as the system user `postgres`, which cannot reach the data
// directory there. The start-up must end with its own message saying what to change, never an
// unhandled `spawn ... EACCES` from a child process.
import { describe, expect, it } from '@jest/globals';
import { execFile } from 'node:child_process';
import { mkdtemp, rm } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join, resolve } from 'node:path';

const ROOT = resolve(import.meta.dirname, '..');
const asRoot = process.getuid?.() === 0;

describe('the demo started as root from a directory only root may enter', () => {
  (asRoot ? it : it.skip)('refuses with its own one-line message naming the directory and the fixes', async () => {
    const closed = await mkdtemp(join(tmpdir(), 'demo-700-')); // mode 700, owned by root
    try {
      const env: NodeJS.ProcessEnv = { ...process.env, PORT: '0' };
      delete env.DATABASE_URL;
      const result = await new Promise<{ code: number | null; output: string }>((done) => {
        execFile(
          process.execPath,
          ['--import', join(ROOT, 'test/support/ts-register.mjs'), join(ROOT, 'apps/demo/src/main.ts')],
          { cwd: closed, env, timeout: 60_000 },
          (error, stdout, stderr) => done({ code: error ? ((error as { code?: number }).code ?? null) : 0, output: stdout + stderr }),
        );
      });
      expect(result.code).toBe(1);
      expect(result.output).toContain(`cannot enter ${closed}`);
      expect(result.output).toContain('set DATABASE_URL');
      expect(result.output).toContain(`chmod o+x ${closed}`);
      expect(result.output).not.toMatch(/EACCES|Unhandled|    at /);
    } finally {
      await rm(closed, { recursive: true, force: true });
    }
  }, 90_000);
});
