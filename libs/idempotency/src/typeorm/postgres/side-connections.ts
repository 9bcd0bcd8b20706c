import { AsyncLocalStorage } from 'node:async_hooks';
import type { DataSource } from 'typeorm';
import { IdempotencyConfigError } from '../../index.js';

/** A transactional run's work, while it runs: what it does with a connection it asks the pool for. */
export interface WorkScope {
  /** How long such a connection may be waited for when the pool has none to give, in milliseconds. */
  boundMs: number;
  /** Whether the work still runs: a timer or a loop it started keeps its async context after it (an adversarial helper: a poller it started had 21 of 27 later queries refused). */
  running: boolean;
  /** Called on each such ask (to say it, once). */
  askedForConnection(): void;
}

const currentWork = new AsyncLocalStorage<WorkScope>();

/** Runs `work` as the work of a transactional run (see `watchSideConnections`). */
export function inWork<T>(scope: WorkScope, work: () => Promise<T>): Promise<T> {
  return currentWork.run(scope, work);
}

type ConnectCallback = (error: Error | undefined, client?: unknown, release?: (error?: unknown) => void) => void;
/** The part of pg-pool this needs. */
interface PgPool {
  connect(callback?: ConnectCallback): unknown;
  readonly options: { max?: number };
}

/** Pools watched already. */
const watched = new WeakSet<object>();

/**
 * Watches the DataSource's primary pool for connections asked for by a transactional run's work
 * (a repository injected with `@InjectRepository`, the DataSource's own, `dataSource.query`,
 * `dataSource.transaction`): another transaction than the run's. Each such ask is told to the
 * scope, and fails after `boundMs` when the pool has given it no connection by then, instead of
 * waiting. Every connection may be held by a run whose work waits
 * for one: an adversarial helper's app, reading through an injected repository in its work, hung
 * for good (every request, and every later one) once as many requests came at once as its pool
 * had connections, and with a pool of one at the first. Asks made outside a work are untouched.
 * Once per pool; called on each run (pools of a later `initialize()` are watched from then on).
 */
export function watchSideConnections(dataSource: DataSource): void {
  if (dataSource.options.type !== 'postgres') return;
  const pool = (dataSource.driver as unknown as { master?: PgPool }).master;
  if (!pool || watched.has(pool) || typeof pool.connect !== 'function') return;
  watched.add(pool);
  const connect = pool.connect;
  pool.connect = function (this: PgPool, ...args: [ConnectCallback?]) {
    const scope = currentWork.getStore();
    if (!scope?.running) return connect.apply(this, args);
    scope.askedForConnection();
    // Always bounded: pg-pool hands an idle connection over on its next turn, and a run's own ask
    // made in the same turn could take it first (an adversarial reviewer); a bound never met costs a timer.
    const [callback] = args;
    if (callback) return connectWithin(this, connect, scope.boundMs, callback);
    return new Promise((resolve, reject) => connectWithin(this, connect, scope.boundMs, (error, client) => (error ? reject(error) : resolve(client))));
  };
}

/** Asks `pool` for a connection, failing `callback` after `boundMs`; a connection that comes later goes back to the pool. */
function connectWithin(pool: PgPool, connect: PgPool['connect'], boundMs: number, callback: ConnectCallback): void {
  let answered = false;
  const timer = setTimeout(() => {
    answered = true;
    callback(
      new IdempotencyConfigError(
        `IdempotentTransactions.run: the work waited ${boundMs} ms for a connection of its own, and every connection of the pool ` +
          `(max ${pool.options.max ?? 10}) is held, by runs among them, which may all be waiting so: use the EntityManager the work is given, ` +
          'for reads too (not an injected repository, the DataSource, dataSource.query or dataSource.transaction); nothing was committed',
      ),
    );
  }, boundMs);
  connect.call(pool, (error, client, release) => {
    if (!answered) {
      answered = true;
      clearTimeout(timer);
      return callback(error, client, release);
    }
    if (!error) release?.();
  });
}
