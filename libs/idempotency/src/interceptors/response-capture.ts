import { AsyncLocalStorage } from 'node:async_hooks';
import { ServerResponse, type OutgoingHttpHeaders } from 'node:http';
import { Http2ServerResponse } from 'node:http2';
import { withoutRefusalHeaders } from './refusal-headers.js';
import { dropLateHeaders, headersSentError, hookResponse, namesSetOn, showReports, type ResponseHook, type Through } from './response-hooks.js';

/** The answer as it left for the first client. */
export interface CapturedResponse {
  statusCode: number;
  /** The allowlisted headers (and `content-encoding`, which the bytes need, and `vary`), lower-case names. */
  headers: Record<string, string>;
  /**
   * The body bytes; undefined when they were over the bound (not kept). A string is bytes that
   * are UTF-8 text without NUL, as that text (an answer sent as one string, as Fastify sends JSON,
   * and Express's `res.send` with ETags off): kept as given, never encoded to be decoded again.
   */
  body: Buffer | string | undefined;
}

/** What a capture saves: the answer sent, or `undefined` when the client never got the handler's. */
export type SaveCaptured = (response: CapturedResponse | undefined) => Promise<void>;

type Args = unknown[];
/** A header's value as Node holds it. */
type HeaderValue = number | string | readonly string[];

interface Reported {
  headersSent: boolean;
  writableEnded: boolean;
}
/**
 * The headers a capture keeps, per list of saved header names (the module's, made once), with
 * those it always keeps: `content-encoding`, which the bytes need, and `vary`, which says whom a
 * cache may give them to (a replay with the saved `Cache-Control: public` and without the
 * handler's `Vary: Authorization` let a shared cache serve one user's answer to anyone: an
 * adversarial helper).
 */
const ALWAYS_CAPTURED = ['content-encoding', 'vary'];
const capturedLists = new WeakMap<readonly string[], readonly string[]>();
function capturedNames(headerNames: readonly string[]): readonly string[] {
  let names = capturedLists.get(headerNames);
  if (!names) {
    names = [...headerNames, ...ALWAYS_CAPTURED.filter((name) => !headerNames.includes(name))];
    capturedLists.set(headerNames, names);
  }
  return names;
}

/**
 * `writeHead`'s headers in Node's array forms, flat (`[name, value, name, value]`) or as pairs
 * (`[[name, value], ...]`), as an object: Node writes them without keeping them on the response.
 */
function headersOfArray(list: unknown[]): OutgoingHttpHeaders {
  const headers: Record<string, string | string[]> = {};
  const add = (name: unknown, value: unknown) => {
    const key = String(name).toLowerCase();
    const text = Array.isArray(value) ? value.map(String) : String(value);
    const had = headers[key];
    headers[key] = had === undefined ? text : ([] as string[]).concat(had, text);
  };
  if (Array.isArray(list[0])) for (const pair of list as unknown[][]) add(pair[0], pair[1]);
  else for (let i = 0; i + 1 < list.length; i += 2) add(list[i], list[i + 1]);
  return headers;
}

const NODE_WRITE_HEAD = ServerResponse.prototype.writeHead;

/**
 * An answer's only chunk, a string, as `CapturedResponse.body`: itself where its bytes are UTF-8
 * text without NUL; its bytes where it holds a lone surrogate (UTF-8 has no bytes for one: Node
 * writes U+FFFD's) or a NUL. Two native scans, not a Unicode regular expression (~900
 * instructions an answer, callgrind, session 37).
 */
function bodyOfText(text: string): Buffer | string {
  return (text as string & { isWellFormed(): boolean }).isWellFormed() && !text.includes('\0') ? text : Buffer.from(text, 'utf8');
}

/**
 * Who answers while the handler runs: `'handler'` (`@Res()`: it sends its own answer, every
 * `end()` while it runs is its; from callbacks of emitters made before the request too, which run
 * outside its async context: taken for another's, their answers were refused to duplicates, and
 * a handler that failed after answering ran again on every retry, an adversarial helper), `'run'`
 * (`@Res({ passthrough: true })`: Nest sends its value, and an `end()` while it runs is its own
 * only from its run, see `owning`), `'nest'` (no `@Res()`: any `end()` while it runs is another's).
 */
export type HandlerAnswers = 'handler' | 'run' | 'nest';

/** The capture whose handler's run this is (`ResponseCapture.owning`). */
const handlerRuns = new AsyncLocalStorage<ResponseCapture>();

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
/** Statuses whose HTTP/2 head ends the stream. */
const BODILESS = new Set([204, 205, 304]);

/** Whether the response is Node's HTTP/2 compatibility response (Fastify's `http2: true`), which sends its head when written. */
function isHttp2(res: ServerResponse): boolean {
  return (res as { stream?: unknown }).stream !== undefined;
}

export class ResponseCapture implements ResponseHook {
  private mode: 'pending' | 'save' | 'pass' | 'foreign' = 'pending';
  private state: 'open' | 'ending' | 'ended' = 'open';
  private held: Args[] = [];
  /** An HTTP/2 head without a body, held until the answer is saved (see `writeHead`). */
  private heldHead: Args | undefined;
  private chunks: Buffer[] = [];
  /** The answer's bytes while they are one string written as UTF-8 (see `record`), before `chunks`. */
  private text: string | undefined;
  private bytes = 0;
  private overflowed = false;
  private head: OutgoingHttpHeaders | undefined;
  /** `content-encoding` as the head was sent through the capture (see `writeHead`); undefined until then. */
  private coding: { value: HeaderValue | undefined } | undefined;
  /** The head went out through the capture to the methods it stands in front of (see `writeHeadBeforeSave`). */
  private headWritten = false;
  /** The response's `writeHead` once the capture was put on: another one later is the app's, in front of it. */
  private readonly hookedWriteHead: ServerResponse['writeHead'];
  /** The status when the capture first held bytes, put back when they go out (`restoreStatus`). */
  private heldStatus: { code: number; message: string | undefined } | undefined;
  /** What the response says of itself (see `report`); undefined until the capture first held bytes. */
  reported: Reported | undefined = undefined;
  private readonly names: readonly string[];
  /** The response's methods before the capture. */
  private readonly through: Through;
  /**
   * True while the capture calls the response's own `end()`: a write that makes is the answer
   * going out, not the app's. light-my-request's `end(data)` (Fastify's `inject()`) writes `data`
   * through `this.write()`.
   */
  private ending = false;

  constructor(
    private readonly raw: ServerResponse,
    headerNames: readonly string[],
    private readonly maxBytes: number,
    private readonly answers: HandlerAnswers,
    private readonly save: SaveCaptured,
  ) {
    this.names = capturedNames(headerNames);
    // A handler that answers itself may hand the response to code that swaps its prototype.
    this.through = hookResponse(raw, this, answers !== 'nest');
    this.hookedWriteHead = raw.writeHead;
    raw.once('close', () => this.onClose());
  }

  writeHead(res: ServerResponse, args: Args): ServerResponse {
    if (this.reported?.headersSent) {
      // Node's own implicit head (`_implicitHeader()`: `writeHead(statusCode)`), which
      // `flushHeaders()` sends when Node has sent none: the capture holds one, and once a head is
      // out flushHeaders() does nothing. Refused, hand-written SSE (write, then flushHeaders())
      // failed after its first event, and every retry ran again (an adversarial helper).
      if (args.length === 1 && args[0] === res.statusCode) return res;
      // A head after held bytes: Node would have sent one already, and refuses another.
      throw headersSentError('write');
    }
    const headers = args.find((arg) => typeof arg === 'object' && arg !== null);
    if (headers) this.head = Array.isArray(headers) ? headersOfArray(headers) : (headers as OutgoingHttpHeaders);
    // The coding of the bytes seen here is the one the app gave them when it sent the head, read
    // before the methods the capture stands in front of: Express's compression middleware labels
    // the response inside its writeHead, and encodes the bytes after they passed here. Read
    // after, the label went with the plain bytes, and no client could decode a replay (an
    // adversarial helper: `@Res()` handlers that send their head first, streamed exports).
    this.coding ??= { value: this.headerOf('content-encoding') };
    this.headWritten = true;
    // On HTTP/2 a head goes out when it is written, and one whose status has no body (204, 205,
    // 304) ends the stream: the client had the whole answer before it was saved, and a duplicate
    // sent then got 409 (an adversarial helper: 6 to 18 of 60 keys, Fastify with http2). It waits
    // for the save, as the bytes of other answers do.
    if (this.mode !== 'pass' && this.mode !== 'foreign' && isHttp2(res) && BODILESS.has(Number(args[0]))) {
      res.statusCode = Number(args[0]);
      this.heldHead = args;
      this.report({ headersSent: true });
      return res;
    }
    return (this.through.writeHead as (...a: Args) => ServerResponse).apply(res, args);
  }

  write(_res: ServerResponse, args: Args): boolean {
    return this.onWrite(args);
  }

  end(res: ServerResponse, args: Args): ServerResponse {
    this.onEnd(args);
    return res;
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
   * Starts the handler (calls `start`, which asks Nest for it: Nest runs the handler in the async
   * context of that call) so that, on a passthrough route (`answers: 'run'`), an `end()` from its
   * run is known as its own, and one from elsewhere (a timeout middleware's timer, set before the
   * handler ran) is not: taken for the handler's, a middleware's 503 was saved, and a handler that
   * then failed kept its key, every retry refused for the key's retention (an adversarial helper,
   * both adapters).
   */
  owning<T>(start: () => T): T {
    return this.answers === 'run' ? handlerRuns.run(this, start) : start();
  }

  /**
   * The run was cut off from the client (an outer timeout, a client that left) while the handler
   * runs: the answer that goes out is not the handler's, and the handler's header changes after
   * it are dropped (`dropLateHeaders`).
   */
  cutOff(): void {
    this.passThrough();
    dropLateHeaders(this.raw);
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
    if (this.ending) return this.through.write.apply(this.raw, args as never);
    const callback = callbackOf(args);
    if (this.state !== 'open') {
      // After end(): Node would fail the write; dropping it is what the client sees either way.
      if (callback) process.nextTick(callback);
      return false;
    }
    if (this.mode === 'pass' || this.mode === 'foreign' || this.overflowed) return this.through.write.apply(this.raw, args as never);
    this.record(args[0], args[1]);
    if (this.overflowed) {
      this.flush();
      return this.through.write.apply(this.raw, args as never);
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
    // an end() then is the handler's own on `@Res()` routes, on passthrough ones when it comes
    // from its run (`owning`), and someone else's otherwise.
    if (this.mode === 'pending') this.mode = this.answers === 'handler' || (this.answers === 'run' && handlerRuns.getStore() === this) ? 'save' : 'foreign';
    if (this.mode === 'foreign') dropLateHeaders(this.raw);
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
    if (this.mode === 'save') this.writeHeadBeforeSave();
    const saved = this.mode === 'save' ? this.save(this.captured()) : Promise.resolve();
    void saved.then(() => {
      this.state = 'ended';
      this.report({});
      if (this.raw.destroyed) return;
      try {
        this.flush();
        this.ending = true;
        this.through.end.apply(this.raw, args as never);
      } catch (error) {
        this.raw.destroy(error as Error);
      } finally {
        this.ending = false;
      }
    });
  }

  /**
   * Writes the head of the answer to be saved (Node keeps it until the first bytes go out)
   * through the response's `writeHead` as it is now, with the status it goes out with, before the
   * answer is read for its record: headers the app sets when the head is written (on-headers
   * listeners, as compression, express-session and response-time use, also one a handler added)
   * are part of it. Read before, on Express (whose `res.send` ends without a head) a private
   * answer's `Cache-Control: no-store` set so was missing from every replay (an adversarial
   * helper). Only where code of the app's stands in front of Node's own `writeHead`, which sets
   * no header. No length is set: the bytes may still change on their way (a middleware that
   * rewrites them), so Node sends the answer chunked. A head refused (a listener's invalid header
   * value) is left to Node's `end()`, which fails the response as it does without the guard,
   * the answer saved first as before: a retry is replayed.
   */
  private writeHeadBeforeSave(): void {
    const raw = this.raw;
    if (this.headWritten || raw.destroyed || (this.through.writeHead === NODE_WRITE_HEAD && raw.writeHead === this.hookedWriteHead)) return;
    if (this.heldStatus) {
      raw.statusCode = this.heldStatus.code;
      if (this.heldStatus.message !== undefined) raw.statusMessage = this.heldStatus.message;
      this.heldStatus = undefined;
    }
    // The head is not out yet: the app's listeners may still set headers (they would be refused).
    const reported = this.reported!;
    reported.headersSent = false;
    try {
      raw.writeHead(raw.statusCode);
    } catch {
      // Node's end() writes the head again and fails the response with this error.
    } finally {
      reported.headersSent = true;
    }
  }

  private flush(): void {
    const held = this.held;
    this.held = [];
    this.report({});
    const head = this.heldHead;
    this.heldHead = undefined;
    if (head) (this.through.writeHead as (...a: Args) => ServerResponse).apply(this.raw, head);
    for (const args of held) this.through.write.apply(this.raw, args as never);
  }

  /**
   * What the app sees of the response while bytes are held: what it did, not what left. The
   * response's `headersSent` and `writableEnded` (see `hookResponse`) answer from what was
   * reported or, when that says nothing, from Node's own getters.
   */
  private report(seen: { headersSent?: true; writableEnded?: true }): void {
    const headersSent = seen.headersSent === true;
    const writableEnded = seen.writableEnded === true;
    if (headersSent) this.heldStatus ??= { code: this.raw.statusCode, message: statusMessageOf(this.raw) };
    if (!this.reported) {
      if (!headersSent && !writableEnded) return;
      this.reported = { headersSent, writableEnded };
      showReports(this.raw, this);
      return;
    }
    this.reported.headersSent = headersSent;
    this.reported.writableEnded = writableEnded;
    if (!headersSent && this.heldStatus) this.restoreStatus(this.heldStatus);
  }

  /**
   * Puts back the status the head had when bytes were first held, unless Node sent a head since:
   * Node would have sent it then, and a status set after (Express's `res.status(201)` does not
   * check `headersSent`) went out over another answer's body (an adversarial helper: a timeout
   * middleware's 503 racing a `@Res()` handler's 201, up to 13 of 40 keys).
   */
  private restoreStatus(held: { code: number; message: string | undefined }): void {
    this.heldStatus = undefined;
    if (this.raw.headersSent) return;
    this.raw.statusCode = held.code;
    if (held.message !== undefined) this.raw.statusMessage = held.message;
  }

  private record(chunk: unknown, encoding: unknown): void {
    if (this.overflowed || chunk === undefined || chunk === null) return;
    // The common answer, one string written as UTF-8 (Node takes a missing or null encoding as
    // UTF-8): kept as text, which is what is saved; a second chunk turns it into bytes.
    const utf8 = typeof encoding !== 'string' || encoding === 'utf8' || encoding === 'utf-8';
    if (typeof chunk === 'string' && utf8 && this.bytes === 0 && this.text === undefined) {
      this.bytes = Buffer.byteLength(chunk, 'utf8');
      if (this.bytes > this.maxBytes) this.overflowed = true;
      else this.text = chunk;
      return;
    }
    if (this.text !== undefined) {
      this.chunks.push(Buffer.from(this.text, 'utf8'));
      this.text = undefined;
    }
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
    const sent = this.sentHeaders();
    for (const name of this.names) {
      const value = name === 'content-encoding' && this.coding ? this.coding.value : sent(name);
      if (value !== undefined) headers[name] = Array.isArray(value) ? value.join(', ') : String(value);
    }
    const chunks = this.chunks;
    // One chunk (Express's res.send gives a Buffer): already a copy of its own, not copied again.
    const bytes = () => (chunks.length === 1 ? chunks[0]! : Buffer.concat(chunks));
    const body = this.overflowed ? undefined : this.text !== undefined ? bodyOfText(this.text) : bytes();
    // Never a refusal's Retry-After or problem details type on another answer (a run after a retry()).
    return { statusCode: this.raw.statusCode, headers: withoutRefusalHeaders(this.raw, this.raw.statusCode, headers), body };
  }

  /** A header as sent (a lower-case name): passed to `writeHead` (Fastify sends them so), or set on the response. */
  headerOf(name: string): HeaderValue | undefined {
    if (this.head) {
      for (const key of Object.keys(this.head)) {
        if (key.toLowerCase() === name) return this.head[key];
      }
    }
    return this.raw.getHeader(name);
  }

  /**
   * The headers as sent, as `headerOf` reads one, for several names (eight saved by default): the
   * names of the head and of the response are read once (see `namesSetOn`); a head's names were
   * lower-cased once per saved name.
   */
  private sentHeaders(): (name: string) => HeaderValue | undefined {
    const { head, raw } = this;
    let inHead: Record<string, HeaderValue | undefined> | undefined;
    if (head) {
      inHead = Object.create(null) as Record<string, HeaderValue | undefined>;
      // The first of two names that differ only in case, as a search of the head finds it.
      for (const key of Object.keys(head)) {
        const lower = key.toLowerCase();
        if (!(lower in inHead)) inHead[lower] = head[key];
      }
    }
    const own = namesSetOn(raw);
    return (name) => {
      if (inHead !== undefined && name in inHead) return inHead[name];
      return own === undefined || own.includes(name) ? raw.getHeader(name) : undefined;
    };
  }
}

/**
 * The response's status message; undefined on HTTP/2, which has none: Node's HTTP/2 response
 * answers '' and prints `UnsupportedWarning: Status message is not supported by HTTP/2` (once a
 * process) for a read or a write of it, which every HTTP/2 app under the guard printed (an
 * adversarial helper).
 */
function statusMessageOf(raw: ServerResponse): string | undefined {
  return (raw as object) instanceof Http2ServerResponse ? undefined : raw.statusMessage;
}
