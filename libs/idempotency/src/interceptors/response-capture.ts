import type { OutgoingHttpHeaders, ServerResponse } from 'node:http';
import { withoutRefusalHeaders } from './refusal-headers.js';

/** The answer as it left for the first client. */
export interface CapturedResponse {
  statusCode: number;
  /** The allowlisted headers (and `content-encoding`, which the bytes need), lower-case names. */
  headers: Record<string, string>;
  /** The body bytes; undefined when they were over the bound (not kept). */
  body: Buffer | undefined;
}

/** What a capture saves: the answer sent, or `undefined` when the client never got the handler's. */
export type SaveCaptured = (response: CapturedResponse | undefined) => Promise<void>;

type Args = unknown[];

interface Reported {
  headersSent: boolean;
  writableEnded: boolean;
}
const REPORTED = Symbol('nestjs-idempotency.reported');
type Reporting = ServerResponse & { [REPORTED]?: Reported };

/**
 * The accessors `report` puts on a response: one function each for every response, so that V8
 * gives every captured response the same shape (a closure per response gave each its own, and
 * Node's HTTP code then ran on a new shape every request).
 */
const reportedAccessors = {
  headersSent: {
    configurable: true,
    get(this: Reporting): boolean {
      return this[REPORTED]?.headersSent || (Reflect.get(Object.getPrototypeOf(this) as object, 'headersSent', this) as boolean);
    },
  },
  writableEnded: {
    configurable: true,
    get(this: Reporting): boolean {
      return this[REPORTED]?.writableEnded || (Reflect.get(Object.getPrototypeOf(this) as object, 'writableEnded', this) as boolean);
    },
  },
} satisfies PropertyDescriptorMap;

/** Puts the shared accessors on `raw`, answering from the state returned. */
function reportedOn(raw: Reporting): Reported {
  const reported: Reported = { headersSent: false, writableEnded: false };
  raw[REPORTED] = reported;
  Object.defineProperties(raw, reportedAccessors);
  return reported;
}
const callbackOf = (args: Args) => args.find((arg) => typeof arg === 'function') as ((error?: Error) => void) | undefined;
const withoutCallback = (args: Args) => args.filter((arg) => typeof arg !== 'function');

/**
 * Sits on the Node.js response of a guarded request (Express's `res`, Fastify's `reply.raw`) and
 * sees the answer exactly as it leaves: after every interceptor, serializer, exception filter
 * and adapter of the app. The body is held back (up to `maxBytes`; past it, it flows and is not
 * kept) until the answer is known to be the handler's and saved, so that an immediate retry is
 * replayed, never refused. While it holds bytes the response reports its head as sent (and,
 * after `end()`, itself as ended), as it would without the guard: an app that then fails, such
 * as a stream erroring mid-way, destroys the response instead of writing a second answer.
 *
 * Whose answer an `end()` is: the handler's once `succeed()` was called, and on routes where the
 * handler sends its own (`@Res()`) any `end()` while it runs; otherwise an `end()` while the
 * handler runs is someone else's (a timeout middleware's): it goes out at once, and the
 * handler's success is then recorded as never delivered. After `passThrough()` (the handler
 * failed, or the run was cut off) everything goes out unsaved. A response that closes without
 * an `end()` after the handler succeeded (the client left, the app destroyed it) is also
 * recorded as never delivered: held bytes are never saved as a whole answer.
 */
export class ResponseCapture {
  private mode: 'pending' | 'save' | 'pass' | 'foreign' = 'pending';
  private state: 'open' | 'ending' | 'ended' = 'open';
  private held: Args[] = [];
  private chunks: Buffer[] = [];
  private bytes = 0;
  private overflowed = false;
  private head: OutgoingHttpHeaders | undefined;
  /** What `report` last said; undefined until it first said anything (no accessors on the response yet). */
  private reported: Reported | undefined;
  private readonly names: readonly string[];
  private readonly write: ServerResponse['write'];
  private readonly end: ServerResponse['end'];
  private readonly writeHead: ServerResponse['writeHead'];

  constructor(
    private readonly raw: ServerResponse,
    headerNames: readonly string[],
    private readonly maxBytes: number,
    private readonly handlerAnswers: boolean,
    private readonly save: SaveCaptured,
  ) {
    this.names = headerNames.includes('content-encoding') ? headerNames : [...headerNames, 'content-encoding'];
    this.write = raw.write;
    this.end = raw.end;
    this.writeHead = raw.writeHead;
    const capture = this;
    raw.writeHead = function (this: ServerResponse, ...args: Args) {
      const headers = args.find((arg) => typeof arg === 'object' && arg !== null && !Array.isArray(arg));
      if (headers) capture.head = headers as OutgoingHttpHeaders;
      return (capture.writeHead as (...a: Args) => ServerResponse).apply(this, args);
    } as ServerResponse['writeHead'];
    raw.write = function (this: ServerResponse, ...args: Args) {
      return capture.onWrite(args);
    } as ServerResponse['write'];
    raw.end = function (this: ServerResponse, ...args: Args) {
      capture.onEnd(args);
      return this;
    } as ServerResponse['end'];
    raw.once('close', () => this.onClose());
  }

  /**
   * The answer (now or to come) is the handler's, and is saved before it ends: the handler
   * succeeded, or (`saveStatuses`) failed in its method, and the answer is what the app's
   * exception filters make of its error.
   */
  succeed(): void {
    if (this.mode === 'foreign') {
      this.mode = 'pass';
      void this.save(undefined);
    }
    if (this.mode === 'pending') this.mode = 'save';
  }

  /**
   * The answer is not the handler's (it failed, or the run was cut off, or an answer to its error
   * is no longer awaited): it goes out unsaved. An answer already ending is left as it is.
   */
  passThrough(): void {
    if (this.mode === 'pass' || (this.mode === 'save' && this.state !== 'open')) return;
    this.mode = 'pass';
    this.flush();
  }

  private onWrite(args: Args): boolean {
    const callback = callbackOf(args);
    if (this.state !== 'open') {
      // After end(): Node would fail the write; dropping it is what the client sees either way.
      if (callback) process.nextTick(callback);
      return false;
    }
    if (this.mode === 'pass' || this.mode === 'foreign' || this.overflowed) return this.write.apply(this.raw, args as never);
    this.record(args[0], args[1]);
    if (this.overflowed) {
      this.flush();
      return this.write.apply(this.raw, args as never);
    }
    this.held.push(withoutCallback(args));
    if (callback) process.nextTick(callback);
    this.report({ headersSent: true });
    return true;
  }

  private onEnd(args: Args): void {
    if (this.state !== 'open') {
      // A second end(): Node ignores it (its callback runs when the response finishes).
      const callback = callbackOf(args);
      if (callback) this.raw.once('finish', () => callback());
      return;
    }
    this.state = 'ending';
    if (typeof args[0] !== 'function') this.record(args[0], args[1]);
    // While the handler runs, Nest has not sent its answer (it waits for the handler's value):
    // an end() then is the handler's own on `@Res()` routes, and someone else's otherwise.
    if (this.mode === 'pending') this.mode = this.handlerAnswers ? 'save' : 'foreign';
    this.finish(args);
  }

  private onClose(): void {
    // Closed with no end(): the client left, or the app destroyed the response (a failed stream).
    if (this.state === 'open' && this.mode === 'save') {
      this.state = 'ended';
      this.held = [];
      void this.save(undefined);
    }
  }

  /** Sends the held answer, after saving it when it is the handler's. */
  private finish(args: Args): void {
    this.report({ headersSent: true, writableEnded: true });
    const saved = this.mode === 'save' ? this.save(this.captured()) : Promise.resolve();
    void saved.then(() => {
      this.state = 'ended';
      this.report({});
      if (this.raw.destroyed) return;
      try {
        this.flush();
        this.end.apply(this.raw, args as never);
      } catch (error) {
        this.raw.destroy(error as Error);
      }
    });
  }

  private flush(): void {
    const held = this.held;
    this.held = [];
    this.report({});
    for (const args of held) this.write.apply(this.raw, args as never);
  }

  /**
   * What the app sees of the response while bytes are held: what it did, not what left. The
   * first report puts two accessors on the response (`reportedOn`), which answer from what was
   * reported or, when that says nothing, from Node's own getters; they stay (a `delete` would turn
   * the response into a slow dictionary object for the rest of its life).
   */
  private report(seen: { headersSent?: true; writableEnded?: true }): void {
    const headersSent = seen.headersSent === true;
    const writableEnded = seen.writableEnded === true;
    if (!this.reported) {
      if (!headersSent && !writableEnded) return;
      this.reported = reportedOn(this.raw);
    }
    this.reported.headersSent = headersSent;
    this.reported.writableEnded = writableEnded;
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
    for (const name of this.names) {
      const value = this.headerOf(name);
      if (value !== undefined) headers[name] = Array.isArray(value) ? value.join(', ') : String(value);
    }
    const body = this.overflowed ? undefined : Buffer.concat(this.chunks);
    // Never a refusal's Retry-After or problem details type on another answer (a run after a retry()).
    return { statusCode: this.raw.statusCode, headers: withoutRefusalHeaders(this.raw, this.raw.statusCode, headers), body };
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
