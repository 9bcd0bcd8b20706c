import { createConnection, createServer, type Server, type Socket } from 'node:net';

/**
 * A loopback TCP proxy in front of a server, for fault tests: it can delay every chunk in both
 * directions, cut every connection, cut one connection as its answer comes back, swallow a
 * request, or accept connections and close them at once (`refusing`).
 */
export class TcpProxy {
  private server!: Server;
  private readonly sockets = new Set<Socket>();
  private dropArmed = false;
  delayMs = 0;
  port = 0;
  /** New connections are accepted and closed at once: a server that is down behind a live address (a load balancer's, a proxy's). */
  refusing = false;
  /** Answers dropped by `dropNextResponse()` so far. */
  droppedResponses = 0;
  /**
   * Called with each chunk a client sends: true swallows it (the server never gets it, and the
   * connection stays open, silent for that request); `cut` then ends that connection on both sides.
   */
  swallowRequest: ((chunk: Buffer, cut: () => void) => boolean) | undefined;

  constructor(private target: { host: string; port: number }) {}

  /** Connections from now on go to `target` (a DNS name's flip); open ones stay where they are. */
  retarget(target: { host: string; port: number }): void {
    this.target = target;
  }

  async start(): Promise<this> {
    this.server = createServer((client) => {
      if (this.refusing) {
        client.on('error', () => undefined);
        client.destroy();
        return;
      }
      const upstream = createConnection(this.target);
      for (const socket of [client, upstream]) {
        this.sockets.add(socket);
        socket.on('close', () => this.sockets.delete(socket));
        socket.on('error', () => socket.destroy());
      }
      this.pipe(client, upstream, false);
      this.pipe(upstream, client, true);
    });
    await new Promise<void>((resolve) => this.server.listen(0, '127.0.0.1', resolve));
    this.port = (this.server.address() as { port: number }).port;
    return this;
  }

  get url(): string {
    return `redis://127.0.0.1:${this.port}`;
  }

  /**
   * The next bytes the server sends are dropped and their connection cut on both sides: the
   * request reached the server, its answer never reaches the client (a network error there).
   */
  dropNextResponse(): void {
    this.dropArmed = true;
  }

  /** Destroys every open connection (new ones are still accepted). */
  cut(): void {
    for (const socket of this.sockets) socket.destroy();
  }

  async stop(): Promise<void> {
    this.cut();
    await new Promise((resolve) => this.server.close(resolve));
  }

  private pipe(from: Socket, to: Socket, fromServer: boolean): void {
    from.on('data', (chunk: Buffer) => {
      if (!fromServer && this.swallowRequest?.(chunk, () => (from.destroy(), to.destroy()))) return;
      if (fromServer && this.dropArmed) {
        this.dropArmed = false;
        this.droppedResponses++;
        from.destroy();
        to.destroy();
        return;
      }
      const send = () => !to.destroyed && to.write(chunk);
      if (this.delayMs > 0) setTimeout(send, this.delayMs).unref();
      else send();
    });
    from.on('end', () => to.end());
  }
}
