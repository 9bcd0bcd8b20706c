/** What a statement on a pooled connection has read so far (its socket's `bytesRead`). */
export type BytesRead = () => number | undefined;

/** pg-pool: emits 'release' with each connection given back (an error: it leaves the pool). */
export interface PgPoolReleases {
  on(event: 'release', listener: (error: unknown, client: object) => void): unknown;
}

/** Per pg pool, what came back on it. */
const progressByPool = new WeakMap<object, PoolProgress>();

/**
 * What came back on one pg pool, for a call waiting for a free connection to tell a pool that
 * moves (a busy database working through its queue) from one that does not (a hung or locked
 * database). Counted: each connection given back whole, whoever used it (the app's own queries
 * wait in the same queue: a pool busy with them is not an outage), and each byte read by the
 * store's running statements after the pool handed them their connection (large answers coming
 * in, which on a loaded machine can all take longer than the bound). Not counted: connections
 * opened, or dropped with an error (a locked table's claims given up on are dropped and replaced
 * by new connections, which would keep waiters waiting through the outage), and the statements
 * run `quietly` (the endings of abandoned server processes, which answer in an outage too).
 */
export class PoolProgress {
  /** Connections given back whole, and bytes read by store statements that have ended. */
  private moved = 0;
  /** Store statements running, each with what its connection had read when it was handed over. */
  private readonly running = new Map<symbol, { from: number; read: BytesRead }>();
  /** Connections running a statement whose giving back does not count. */
  private readonly quiet = new WeakSet<object>();

  static of(pool: PgPoolReleases): PoolProgress {
    let progress = progressByPool.get(pool);
    if (!progress) {
      const created = (progress = new PoolProgress());
      progressByPool.set(pool, created);
      pool.on('release', (error, client) => {
        if (!error && !created.quiet.has(client)) created.moved++;
      });
    }
    return progress;
  }

  /** A store statement was handed a connection; call what it returns when it ends. */
  started(read: BytesRead): () => void {
    const id = Symbol('statement');
    const from = read() ?? 0;
    this.running.set(id, { from, read });
    return () => {
      if (this.running.delete(id)) this.moved += Math.max((read() ?? from) - from, 0);
    };
  }

  /** `client` runs a statement whose giving back does not count; call what it returns once it is given back. */
  quietly(client: object): () => void {
    this.quiet.add(client);
    return () => this.quiet.delete(client);
  }

  /** A figure that grows whenever something came back on the pool: compare two taken apart. */
  mark(): number {
    let mark = this.moved;
    for (const { from, read } of this.running.values()) mark += Math.max((read() ?? from) - from, 0);
    return mark;
  }
}
