/** What a statement on a pooled connection has read so far (its socket's `bytesRead`). */
export type BytesRead = () => number | undefined;

/** Per pg pool, what the store's statements have got back on it. */
const progressByPool = new WeakMap<object, PoolProgress>();

/**
 * What the store's statements have got back on one pg pool, for a call waiting for a free
 * connection to tell a pool that moves (a busy database working through its queue) from one that
 * does not (a hung or locked database). Counted: each statement answered, and each byte read on
 * a connection after a statement was handed it (a large answer coming in, which can take longer
 * than the bound on a loaded machine). Not counted: connections opened and handed over (a locked
 * table's claims given up on are replaced by new connections, which would keep waiters waiting
 * through the outage), and the statements of runners that do not show progress.
 */
export class PoolProgress {
  /** Answers, and bytes read by statements that have ended. */
  private ended = 0;
  /** Statements running, each with what its connection had read when it was handed over. */
  private readonly running = new Map<symbol, { from: number; read: BytesRead }>();

  static of(pool: object): PoolProgress {
    let progress = progressByPool.get(pool);
    if (!progress) progressByPool.set(pool, (progress = new PoolProgress()));
    return progress;
  }

  /** A statement was handed a connection; call what it returns when it ends (answered or not). */
  started(read: BytesRead): (answered: boolean) => void {
    const id = Symbol('statement');
    const from = read() ?? 0;
    this.running.set(id, { from, read });
    return (answered) => {
      if (!this.running.delete(id)) return;
      this.ended += (answered ? 1 : 0) + Math.max((read() ?? from) - from, 0);
    };
  }

  /** A figure that grows whenever something came back on the pool: compare two taken apart. */
  mark(): number {
    let mark = this.ended;
    for (const { from, read } of this.running.values()) mark += Math.max((read() ?? from) - from, 0);
    return mark;
  }
}
