/** A pooled pg connection: its protocol connection (each message it parsed, as an event) and socket. */
export interface PgPooledConnection {
  connection?: {
    stream?: { bytesRead?: number };
    on(event: Unsolicited, listener: (message: { length?: number }) => void): unknown;
  };
}

/**
 * Messages the server sends on its own, not as an answer: a NOTIFY to a session that listens, a
 * notice (a lock wait logged to a client whose `client_min_messages` lets it through), a changed
 * parameter.
 */
type Unsolicited = 'notification' | 'notice' | 'parameterStatus';
const UNSOLICITED: Unsolicited[] = ['notification', 'notice', 'parameterStatus'];

/** pg-pool's events about its connections: handed out, given back (an error: it leaves the pool), gone. */
export interface PgPoolEvents {
  on(event: 'acquire' | 'remove', listener: (client: PgPooledConnection) => void): unknown;
  on(event: 'release', listener: (error: unknown, client: PgPooledConnection) => void): unknown;
}

/** Per pg pool, what came back on it. */
const progressByPool = new WeakMap<object, PoolProgress>();

/** Per connection, the bytes of the messages the server sent on its own (`Unsolicited`). */
const unsolicitedBytes = new WeakMap<object, number>();

/** What `client` read that answered something: its socket's bytes, less the unsolicited messages. */
function answerBytes(client: PgPooledConnection): number {
  const { connection } = client;
  if (!connection) return 0;
  if (!unsolicitedBytes.has(client)) {
    unsolicitedBytes.set(client, 0);
    // A message's length field counts itself, not its one-byte type.
    const heard = (message: { length?: number }) => unsolicitedBytes.set(client, (unsolicitedBytes.get(client) ?? 0) + (message.length ?? 0) + 1);
    for (const event of UNSOLICITED) connection.on(event, heard);
  }
  return (connection.stream?.bytesRead ?? 0) - (unsolicitedBytes.get(client) ?? 0);
}

/**
 * What came back on one pg pool, for a call waiting for a free connection to tell a pool that
 * moves (a busy database working through its queue) from one that does not (a hung or locked
 * database). Counted: the bytes each connection read while it was handed out, whoever holds it
 * (the app's own queries wait in the same queue, and a large answer coming in on a loaded machine
 * can take longer than the bound). Every answer has bytes; a statement that got none (pg's
 * `query_timeout` on a hung server, a lock that never comes), a connection given back unused or
 * one just opened count nothing, nor do messages the server sends on its own (`Unsolicited`: a
 * listening session's NOTIFYs go on through an outage). Nor do the statements run `quietly` (the
 * endings of abandoned server processes, which answer in an outage too, and would keep waiters
 * waiting through it).
 */
export class PoolProgress {
  /** The bytes counted so far: it only grows. */
  private moved = 0;
  /** The connections handed out, each with what it had read when last counted. */
  private readonly out = new Map<PgPooledConnection, number>();
  /** Connections running a statement whose answer does not count. */
  private readonly quiet = new WeakSet<object>();

  static of(pool: PgPoolEvents): PoolProgress {
    let progress = progressByPool.get(pool);
    if (!progress) {
      const created = (progress = new PoolProgress());
      progressByPool.set(pool, created);
      pool.on('acquire', (client) => created.out.set(client, answerBytes(client)));
      pool.on('release', (_error, client) => created.givenBack(client));
      pool.on('remove', (client) => created.givenBack(client));
      // The connections handed out before (pg-pool's own lists): their answers count from now.
      const { _clients: clients = [], _idle: idle = [] } = pool as { _clients?: PgPooledConnection[]; _idle?: { client: unknown }[] };
      const idleClients = new Set(idle.map((item) => item.client));
      for (const client of clients) {
        if ((client as { _connected?: boolean })._connected && !idleClients.has(client)) created.out.set(client, answerBytes(client));
      }
    }
    return progress;
  }

  /** `client` runs a statement whose answer does not count; call what it returns once it is given back. */
  quietly(client: object): () => void {
    this.quiet.add(client);
    return () => this.quiet.delete(client);
  }

  /** A figure that grows whenever bytes came back on the pool: compare two taken apart. */
  mark(): number {
    for (const client of this.out.keys()) this.count(client);
    return this.moved;
  }

  private givenBack(client: PgPooledConnection): void {
    this.count(client);
    this.out.delete(client);
  }

  private count(client: PgPooledConnection): void {
    const from = this.out.get(client);
    const now = answerBytes(client);
    if (from === undefined || now <= from) return;
    if (!this.quiet.has(client)) this.moved += now - from;
    this.out.set(client, now);
  }
}
