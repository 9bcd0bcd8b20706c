import { describe, expect, it } from '@jest/globals';
import { execFile } from 'node:child_process';
import { resolve } from 'node:path';
import { promisify } from 'node:util';

const PREFLIGHT = resolve(import.meta.dirname, 'support/preflight.mjs');

/** Runs `npm test`'s first step with `env` over the real one; resolves with its exit code and output. */
async function preflight(env: Record<string, string>): Promise<{ code: number; stdout: string; stderr: string }> {
  try {
    const { stdout, stderr } = await promisify(execFile)(process.execPath, [PREFLIGHT], { env: { ...process.env, ...env }, timeout: 20_000 });
    return { code: 0, stdout, stderr };
  } catch (error) {
    const failed = error as { code: number; stdout: string; stderr: string };
    return { code: failed.code, stdout: failed.stdout, stderr: failed.stderr };
  }
}

describe('npm test, before the type-check', () => {
  it('stops at once with one line naming a service that is down, its URL and how to start it', async () => {
    const { code, stdout, stderr } = await preflight({ DATABASE_URL: 'postgres://postgres:secret@127.0.0.1:1/test' });
    expect(code).toBe(1);
    expect(stdout).toMatch(/^npm test: checks the services/);
    const lines = stderr.trim().split('\n');
    expect(lines).toHaveLength(1);
    expect(lines[0]).toMatch(/^PostgreSQL is down at postgres:\/\/postgres:\*\*\*@127\.0\.0\.1:1\/test \(.+\): start it .* or set DATABASE_URL$/);
  });

  it('passes when every service answers', async () => {
    const { code, stdout } = await preflight({});
    expect(code).toBe(0);
    expect(stdout).toMatch(/services up: PostgreSQL, Redis, RabbitMQ/);
  });
});
