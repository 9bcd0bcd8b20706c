import { createConnection, createServer, type Server, type Socket } from 'node:net';

/**
 * A loopback TCP proxy in front of a server, for fault tests: it can delay every chunk in both
 * directions, or cut every connection.
 */
export class TcpProxy {
  private server!: Server;
  private readonly sockets = new Set<Socket>();
  delayMs = 0;
  port = 0;

  constructor(private readonly target: { host: string; port: number }) {}

  async start(): Promise<this> {
    this.server = createServer((client) => {
      const upstream = createConnection(this.target);
      for (const socket of [client, upstream]) {
        this.sockets.add(socket);
        socket.on('close', () => this.sockets.delete(socket));
        socket.on('error', () => socket.destroy());
      }
      this.pipe(client, upstream);
      this.pipe(upstream, client);
    });
    await new Promise<void>((resolve) => this.server.listen(0, '127.0.0.1', resolve));
    this.port = (this.server.address() as { port: number }).port;
    return this;
  }

  get url(): string {
    return `redis://127.0.0.1:${this.port}`;
  }

  /** Destroys every open connection (new ones are still accepted). */
  cut(): void {
    for (const socket of this.sockets) socket.destroy();
  }

  async stop(): Promise<void> {
    this.cut();
    await new Promise((resolve) => this.server.close(resolve));
  }

  private pipe(from: Socket, to: Socket): void {
    from.on('data', (chunk) => {
      const send = () => !to.destroyed && to.write(chunk);
      if (this.delayMs > 0) setTimeout(send, this.delayMs).unref();
      else send();
    });
    from.on('end', () => to.end());
  }
}
