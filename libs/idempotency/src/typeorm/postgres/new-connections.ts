import type { DataSource } from 'typeorm';

/** The part of a pg Client (a pooled connection) this needs. */
interface PgEmitter {
  on(event: 'error', listener: (error: Error) => void): unknown;
  removeListener(event: 'error', listener: (error: Error) => void): unknown;
}
/** pg-pool: emits 'connect' with each new connection, just before it hands it to its caller. */
interface PgPool {
  on(event: 'connect', listener: (client: PgEmitter) => void): unknown;
}

/** Pools already listened to. */
const covered = new WeakSet<object>();

/**
 * Keeps a connection that fails as pg-pool hands it over from ending the process. A new pooled
 * connection reaches its caller from inside the socket read that brought its "ready"; when the
 * same read also brings the server's "terminating" (a failover, a restart,
 * `pg_terminate_backend`), the connection emits 'error' before TypeORM's QueryRunner listens to
 * it (a promise turn later), and an 'error' nobody listens to ends a Node.js process. So each new
 * connection of the DataSource's pools (the primary's and the replicas') has a listener until that
 * read and its promise turns are over; the failed connection is not queryable, its first statement
 * fails, and the pool drops it when it comes back. From then on this covers every TypeORM
 * operation on the pools, the app's own too (plain `dataSource.transaction()` crashed the same
 * way). Once per pool; nothing before the DataSource is initialized, so it is called on each use
 * (a WeakSet lookup), and pools made by a later `initialize()` are covered from the next use.
 */
export function coverNewConnections(dataSource: DataSource): void {
  if (dataSource.options.type !== 'postgres') return;
  const { master, slaves } = dataSource.driver as unknown as { master?: PgPool; slaves?: PgPool[] };
  for (const pool of [master, ...(slaves ?? [])]) {
    if (!pool || covered.has(pool)) continue;
    covered.add(pool);
    pool.on('connect', (client) => {
      const untilListened = () => undefined;
      client.on('error', untilListened);
      setImmediate(() => client.removeListener('error', untilListened));
    });
  }
}
