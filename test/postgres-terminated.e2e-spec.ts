// PostgreSQL ending the store's connections under load (a failover, a restart, an operator's
// pg_terminate_backend): each statement caught by it fails, and the guard answers that as an
// outage. The process must live: a new pooled connection whose "ready" and the server's
// "terminating" arrived in one socket read emitted 'error' before the store listened to it, and
// an 'error' event nobody listens to ends a Node.js process. The same read crashed
// IdempotentTransactions and consumeOnce, whose connections are TypeORM's QueryRunners (TypeORM
// listens a promise turn late: plain `dataSource.transaction()` crashed as well; found in
// session 14, pinned in session 15).
import { afterAll, beforeAll, describe, expect, it } from '@jest/globals';
import { spawn } from 'node:child_process';
import { randomUUID } from 'node:crypto';
import pg from 'pg';
import { IDEMPOTENCY_MIGRATIONS } from '../libs/idempotency/src/typeorm/index.js';
import { DATABASE_URL } from './support/services.js';
import { dropSchemaDataSource, openSchemaDataSource, testSchemaName } from './support/test-schema.js';
import type { DataSource } from 'typeorm';

describe('the PostgreSQL features while the database terminates their connections', () => {
  let dataSource: DataSource;
  const schema = testSchemaName();
  beforeAll(async () => {
    dataSource = await openSchemaDataSource(schema, { migrations: [...IDEMPOTENCY_MIGRATIONS], migrationsRun: true });
  });
  afterAll(async () => dropSchemaDataSource(dataSource));

  it.each(['store', 'transactions', 'consume', 'app-after-store'])('%s: answers the calls it cut as errors, and the process lives', async (mode) => {
    const app = `terminated-${randomUUID().slice(0, 8)}`;
    const child = spawn(process.execPath, ['--import', './test/support/ts-register.mjs', 'test/support/pg-terminate-child.ts'], {
      env: { ...process.env, DATABASE_URL, PG_SCHEMA: schema, PG_APP: app, ROUNDS: mode === 'store' ? '80' : '40', MODE: mode },
      stdio: ['ignore', 'pipe', 'pipe'],
    });
    let out = '';
    let err = '';
    child.stdout.on('data', (chunk: Buffer) => (out += chunk.toString()));
    child.stderr.on('data', (chunk: Buffer) => (err += chunk.toString()));
    const exited = new Promise<number | null>((resolve) => child.once('exit', (code) => resolve(code)));
    // Its start-up is not under test: the terminations begin once its DataSource is open.
    const started = Date.now();
    while (!out.includes('ready') && child.exitCode === null && Date.now() - started < 30_000) {
      await new Promise((resolve) => setTimeout(resolve, 20));
    }

    const admin = new pg.Client({ connectionString: DATABASE_URL });
    await admin.connect();
    let running = true;
    void exited.then(() => (running = false));
    let terminated = 0;
    try {
      while (running) {
        const { rows } = await admin.query(
          "SELECT count(pg_terminate_backend(pid))::int AS n FROM pg_stat_activity WHERE application_name = $1",
          [app],
        );
        terminated += rows[0].n;
        await new Promise((resolve) => setTimeout(resolve, 20));
      }
    } finally {
      await admin.end();
    }
    const code = await exited;
    expect({ code, survived: /survived \d+/.test(out), stderr: err.split('\n').slice(0, 4).join(' ') }).toEqual({
      code: 0,
      survived: true,
      stderr: '',
    });
    expect(terminated).toBeGreaterThan(0);
  }, 240_000);
});
