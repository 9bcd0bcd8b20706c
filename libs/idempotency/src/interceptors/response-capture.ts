import type { OutgoingHttpHeaders, ServerResponse } from 'node:http';

/** The answer as it left for the first client. */
export interface CapturedResponse {
  statusCode: number;
  /** The allowlisted headers, lower-case names. */
  headers: Record<string, string>;
  /** The body bytes; undefined when they were over the bound (not kept). */
  body: Buffer | undefined;
}

/** What a capture saves: the answer sent, or `undefined` when the client never got one. */
export type SaveCaptured = (response: CapturedResponse | undefined) => Promise<void>;

type WriteArgs = [chunk: unknown, encoding?: unknown, callback?: unknown];

/**
 * Sits on the Node.js response of a guarded request (Express's `res`, Fastify's `reply.raw`) and
 * sees the answer exactly as it leaves: after every interceptor, serializer, exception filter
 * and adapter of the app. The body is held back (up to `maxBytes`) until the transport decides:
 * - `succeed()`: the handler succeeded, so the answer is the handler's: it is saved (`save`)
 *   before the client gets its last byte, so an immediate retry is replayed, not refused;
 * - `passThrough()`: the answer is not the handler's (it failed, or the run was cut off): it goes
 *   out unsaved.
 * An answer that ends before the decision waits for it (a handler writing through `@Res()`).
 * When the response closes after `succeed()` with no answer sent (the client went away and the
 * app sent nothing), `save(undefined)` records that the handler's answer was never delivered.
 */
export class ResponseCapture {
  private mode: 'pending' | 'save' | 'pass' = 'pending';
  private held: WriteArgs[] = [];
  private chunks: Buffer[] = [];
  private bytes = 0;
  private overflowed = false;
  private head: OutgoingHttpHeaders | undefined;
  private ending: (() => void) | undefined;
  private ended = false;
  private readonly write: ServerResponse['write'];
  private readonly end: ServerResponse['end'];
  private readonly writeHead: ServerResponse['writeHead'];

  constructor(
    private readonly raw: ServerResponse,
    private readonly headerNames: readonly string[],
    private readonly maxBytes: number,
    private readonly save: SaveCaptured,
  ) {
    this.write = raw.write;
    this.end = raw.end;
    this.writeHead = raw.writeHead;
    const capture = this;
    raw.writeHead = function (this: ServerResponse, ...args: unknown[]) {
      const headers = args.find((arg) => typeof arg === 'object' && arg !== null && !Array.isArray(arg));
      if (headers) capture.head = headers as OutgoingHttpHeaders;
      return (capture.writeHead as (...a: unknown[]) => ServerResponse).apply(this, args);
    } as ServerResponse['writeHead'];
    raw.write = function (this: ServerResponse, ...args: WriteArgs) {
      return capture.onWrite(args);
    } as ServerResponse['write'];
    raw.end = function (this: ServerResponse, ...args: WriteArgs) {
      capture.onEnd(args);
      return this;
    } as ServerResponse['end'];
    raw.once('close', () => {
      if (this.mode === 'save' && !this.ending) {
        this.ending = () => undefined;
        void this.save(undefined);
      }
    });
  }

  succeed(): void {
    if (this.mode !== 'pending') return;
    this.mode = 'save';
    this.ending?.();
  }

  passThrough(): void {
    if (this.mode !== 'pending') return;
    this.mode = 'pass';
    this.flush();
    this.ending?.();
  }

  private onWrite(args: WriteArgs): boolean {
    if (this.ended || this.mode === 'pass' || this.overflowed) return this.write.apply(this.raw, args as never);
    this.record(args[0], args[1]);
    if (this.overflowed) {
      this.flush();
      return this.write.apply(this.raw, args as never);
    }
    this.held.push(args);
    return true;
  }

  private onEnd(args: WriteArgs): void {
    if (this.ended || this.ending) {
      this.end.apply(this.raw, args as never);
      return;
    }
    if (typeof args[0] !== 'function') this.record(args[0], args[1]);
    this.ending = () => {
      this.ending = () => undefined;
      const sent = this.mode === 'save' ? this.save(this.captured()) : Promise.resolve();
      void sent.then(() => {
        this.ended = true;
        this.flush();
        this.end.apply(this.raw, args as never);
      });
    };
    if (this.mode !== 'pending') this.ending();
  }

  private flush(): void {
    const held = this.held;
    this.held = [];
    for (const args of held) this.write.apply(this.raw, args as never);
  }

  private record(chunk: unknown, encoding: unknown): void {
    if (this.overflowed || chunk === undefined || chunk === null) return;
    const bytes =
      typeof chunk === 'string'
        ? Buffer.from(chunk, typeof encoding === 'string' ? (encoding as BufferEncoding) : 'utf8')
        : Buffer.from(chunk as Uint8Array);
    this.bytes += bytes.length;
    if (this.bytes > this.maxBytes) {
      this.overflowed = true;
      this.chunks = [];
      return;
    }
    this.chunks.push(bytes);
  }

  private captured(): CapturedResponse {
    const headers: Record<string, string> = {};
    for (const name of this.headerNames) {
      const value = this.headerOf(name);
      if (value !== undefined) headers[name] = Array.isArray(value) ? value.join(', ') : String(value);
    }
    const body = this.overflowed ? undefined : Buffer.concat(this.chunks);
    return { statusCode: this.raw.statusCode, headers, body };
  }

  /** A header as sent: set on the response, or passed to `writeHead` (Fastify sends them so). */
  private headerOf(name: string): number | string | readonly string[] | undefined {
    if (this.head) {
      for (const key of Object.keys(this.head)) {
        if (key.toLowerCase() === name) return this.head[key];
      }
    }
    return this.raw.getHeader(name);
  }
}
