import { IdempotentRequestError } from './idempotent-request.error.js';
import { encodeBody } from './request-body.js';
import {
  BACKOFF_DEFAULTS,
  backoffDelayMs,
  isRetryableAnswer,
  parseRetryAfterMs,
  IN_PROGRESS_CODE,
  type BackoffOptions,
} from './retry-policy.js';

/** The request header of the IETF Idempotency-Key draft (what the guard reads by default). */
export const IDEMPOTENCY_KEY_HEADER = 'Idempotency-Key';

/** The response header the guard sets on a replayed answer (`Idempotent-Replayed: true`). */
export const REPLAYED_HEADER = 'Idempotent-Replayed';

/** What `new Headers()` takes: a plain object, an array of pairs or a `Headers`. */
export type HeadersLike = ConstructorParameters<typeof Headers>[0];

/** The longest delay a timer holds (2^31 - 1 ms, 24.8 days); a longer one fires after 1 ms. */
const MAX_TIMER_MS = 2 ** 31 - 1;
/** The shortest wait between two attempts answered 409 in progress, whatever the backoff says. */
const MIN_IN_PROGRESS_WAIT_MS = 50;

/** Options of `createIdempotentClient()`. */
export interface IdempotentClientOptions {
  /** Prefix of every path, e.g. `https://api.example.com/v1`. */
  baseUrl: string | URL;
  /** The fetch to use (a mock, undici with an agent, ...). Default: the global `fetch`. */
  fetch?: typeof fetch;
  /** Retries after the first attempt. Default 3. */
  retries?: number;
  /** Delays between attempts (a `Retry-After` on the answer replaces it). */
  backoff?: BackoffOptions;
  /**
   * Bound on one operation, all attempts and waits included, in milliseconds. When the next wait
   * would cross it, the client stops and returns the last answer (or throws when it has none).
   * Default 30,000.
   */
  timeoutMs?: number;
  /**
   * Bound on one attempt (until its body is read), in milliseconds; then it counts as a network
   * error. Default 10,000; at most 2^31 - 1 (24.8 days, what a timer holds).
   */
  attemptTimeoutMs?: number;
  /**
   * The header that carries the key. Default `Idempotency-Key`. `false` when the server reads the
   * key from the body (e.g. the demo's `orderNo`): no header is sent and no key generated, and the
   * unchanged body is what makes the retries one operation.
   */
  keyHeader?: string | false;
  /** Makes the key of a new operation. Default `crypto.randomUUID()`. */
  generateKey?: () => string;
  /** Headers sent with every request (authentication, tenant, ...). */
  headers?: HeadersLike;
  /**
   * The largest answer body read, in bytes. A larger one ends the operation with
   * `IdempotentRequestError` (not retried: the server would send it again), reading no further.
   * Default 10 MiB.
   */
  maxResponseBytes?: number;
}

/** Per-operation options. */
export interface IdempotentRequestOptions {
  /**
   * The operation's key. Default: a new one from `generateKey`. Pass your own to resume an
   * operation whose outcome you did not learn (e.g. after a crash), within the server's retention.
   */
  key?: string;
  /** Headers of this operation, over the client's. */
  headers?: HeadersLike;
  /** Aborts the operation: the attempt in flight and any wait. The promise rejects with the signal's reason. */
  signal?: AbortSignal;
}

/** The final answer of an operation. */
export interface IdempotentResponse<T = unknown> {
  status: number;
  /** `status` is 2xx. */
  ok: boolean;
  headers: Headers;
  /** Parsed JSON when the answer says JSON, else the text; undefined when empty. */
  body: T;
  /** The server answered from its record of an earlier attempt (`Idempotent-Replayed: true`). */
  replayed: boolean;
  /** How many requests were sent, this one included. */
  attempts: number;
  /** The key every attempt carried (undefined with `keyHeader: false`). */
  key: string | undefined;
}

export interface IdempotentClient {
  /** One operation: one key, reused on every retry. */
  request<T = unknown>(method: string, path: string, body?: unknown, options?: IdempotentRequestOptions): Promise<IdempotentResponse<T>>;
  post<T = unknown>(path: string, body?: unknown, options?: IdempotentRequestOptions): Promise<IdempotentResponse<T>>;
  patch<T = unknown>(path: string, body?: unknown, options?: IdempotentRequestOptions): Promise<IdempotentResponse<T>>;
}

/**
 * A fetch-based client for APIs behind an idempotency guard. Each call is one operation with one
 * key, sent on every attempt; it retries network errors, attempt timeouts, 5xx and the guard's
 * 409 "in progress" (waiting `Retry-After`), with exponential backoff and jitter, within
 * `timeoutMs`. Other answers (2xx, 400, 422, other 4xx) are returned at once.
 */
export function createIdempotentClient(options: IdempotentClientOptions): IdempotentClient {
  const fetchImpl = options.fetch ?? globalThis.fetch;
  const retries = options.retries ?? 3;
  const timeoutMs = options.timeoutMs ?? 30_000;
  const attemptTimeoutMs = options.attemptTimeoutMs ?? 10_000;
  const maxResponseBytes = options.maxResponseBytes ?? 10 * 1024 * 1024;
  const keyHeader = options.keyHeader ?? IDEMPOTENCY_KEY_HEADER;
  const generateKey = options.generateKey ?? (() => globalThis.crypto.randomUUID());
  const backoff = {
    ...BACKOFF_DEFAULTS,
    ...Object.fromEntries(Object.entries(options.backoff ?? {}).filter(([, value]) => value !== undefined)),
  } as Required<BackoffOptions>;
  const base = String(options.baseUrl).replace(/\/+$/, '');
  if (typeof fetchImpl !== 'function') throw new TypeError(`fetch must be a function, got ${typeof fetchImpl}`);
  if (!Number.isInteger(retries) || retries < 0) throw new TypeError(`retries must be a whole number >= 0, got ${retries}`);
  for (const [name, value] of Object.entries({ timeoutMs, attemptTimeoutMs, maxResponseBytes, ...backoff })) {
    if (!Number.isFinite(value) || value < 0) throw new TypeError(`${name} must be a number >= 0, got ${value}`);
  }
  // A bound under 1 ms aborted every attempt after 1 ms: no call could ever succeed.
  for (const [name, value] of Object.entries({ timeoutMs, attemptTimeoutMs })) {
    if (value < 1) throw new TypeError(`${name} must be at least 1 (a shorter bound ends every attempt at once), got ${value}`);
  }
  // One timer bounds an attempt; a longer one would fire after 1 ms (and abort every attempt).
  if (attemptTimeoutMs > MAX_TIMER_MS) {
    throw new TypeError(`attemptTimeoutMs must be at most ${MAX_TIMER_MS} (what a timer holds), got ${attemptTimeoutMs}`);
  }

  async function request<T>(method: string, path: string, body?: unknown, opts: IdempotentRequestOptions = {}): Promise<IdempotentResponse<T>> {
    const deadline = Date.now() + timeoutMs;
    const headers = headersOf(options.headers);
    headersOf(opts.headers).forEach((value, name) => headers.set(name, value));
    // A key the caller put in the headers is the operation's: replaced by a new one, a re-send
    // with it ran twice (an adversarial helper).
    // With no key header, a key is never sent: reported as the operation's, two operations keyed
    // apart were one at the server, the second answered the first's replay (an adversarial helper).
    if (keyHeader === false && opts.key !== undefined) {
      throw new TypeError(`{ key: ${JSON.stringify(opts.key)} } with keyHeader: false: no header would carry it; put the key in the body the server reads it from`);
    }
    const given = keyHeader === false ? null : headers.get(keyHeader);
    if (opts.key !== undefined && given !== null && given !== opts.key) {
      throw new TypeError(`two keys for one operation: { key: ${JSON.stringify(opts.key)} } and the ${keyHeader} header ${JSON.stringify(given)}`);
    }
    const key = keyHeader === false ? undefined : (opts.key ?? given ?? generateKey());
    if (keyHeader !== false && key !== undefined) headers.set(keyHeader, key);
    const payload = await encodeBody(body, headers);
    const url = `${base}/${path.replace(/^\/+/, '')}`;
    // What fetch refuses before sending (a GET with a body, a forbidden method, an invalid URL) it
    // would refuse on every attempt: the caller gets its TypeError now, not retries without an
    // answer. A fetch of the caller's own (a test double, another client) may take a URL the
    // global one refuses (a relative one): its URL is not checked.
    new Request(options.fetch === undefined ? url : 'http://fetch.invalid/', { method, headers, body: payload });

    // The retries spent: a 409 of a request still in progress spends none (it is waited out within
    // timeoutMs: spending them, a handler longer than a few backoffs got the caller the 409, never
    // the replay, an adversarial helper).
    let spent = 0;
    /** The last answer, kept when later attempts get none (an adversarial helper: a 503, then resets, threw "without an answer"). */
    let last: IdempotentResponse<T> | undefined;
    for (let attempts = 1; ; attempts++) {
      opts.signal?.throwIfAborted();
      const attemptSignal = AbortSignal.timeout(Math.max(1, Math.min(attemptTimeoutMs, deadline - Date.now())));
      const signal = opts.signal ? eitherSignal(opts.signal, attemptSignal) : { signal: attemptSignal, release: () => undefined };
      let answer: IdempotentResponse<T> | undefined;
      let failure: unknown;
      let sending: Promise<Response>;
      try {
        sending = Promise.resolve(
          fetchImpl(url, {
            method,
            headers,
            body: payload,
            // A redirect is the answer: followed, it carried the key and the body to its Location
            // (another host), and a redirect to itself sent the request 21 times an attempt.
            redirect: 'manual',
            signal: signal.signal,
          }),
        );
      } catch (error) {
        // A fetch that throws as it is called sent nothing, and would throw so on every attempt: at
        // once. After an attempt that went out, with the key: the operation may have happened, and
        // a bare error lost the key the caller needs to learn how it ended (an adversarial helper).
        signal.release();
        if (attempts === 1) throw error;
        throw new IdempotentRequestError(`${method} ${url} failed: fetch threw as attempt ${attempts} was made: ${(error as Error)?.message ?? String(error)}`, key, attempts - 1, {
          cause: error,
        });
      }
      try {
        // Bounded here too: a fetch of the caller's own that ignores the signal kept a call with
        // timeoutMs 500 for 3 s (an adversarial helper). Read inside the attempt: a connection cut
        // mid-body is a network error too.
        const [res, text] = await untilAborted(
          sending.then(async (res) => [res, await readText(res, maxResponseBytes)] as const),
          signal.signal,
        );
        if (text === undefined) {
          throw new IdempotentRequestError(`${method} ${url}: the answer (${res.status}) is over maxResponseBytes (${maxResponseBytes})`, key, attempts);
        }
        answer = {
          status: res.status,
          ok: res.ok,
          headers: res.headers,
          body: decodeBody(text, res.headers, res.status, method) as T,
          replayed: res.headers.get(REPLAYED_HEADER)?.toLowerCase() === 'true',
          attempts,
          key,
        };
        if (!isRetryableAnswer(answer.status, res.headers.get('retry-after'), answer.body)) return answer;
        last = answer;
      } catch (error) {
        if (opts.signal?.aborted) throw opts.signal.reason;
        if (error instanceof IdempotentRequestError) throw error;
        failure = error;
      } finally {
        signal.release();
      }

      const inProgress = answer !== undefined && isInProgress(answer);
      if (!inProgress) spent++;
      let waitMs = (answer && parseRetryAfterMs(answer.headers.get('retry-after'))) ?? backoffDelayMs(spent || attempts, backoff);
      // Spending no retry, a wait of 0 (`Retry-After: 0`, a date past) would send back to back until timeoutMs.
      // Waits in progress spend no retry: never back to back (backoff.baseMs 0 sent 506 requests
      // in 2 s to a route answering Retry-After: 0; an adversarial helper).
      if (inProgress) waitMs = Math.max(waitMs, backoff.baseMs, MIN_IN_PROGRESS_WAIT_MS);
      const outOfTime = Date.now() + waitMs >= deadline;
      if (spent > retries || outOfTime) {
        if (last) return { ...last, attempts };
        const why = outOfTime ? `the ${timeoutMs} ms bound ran out` : `${retries} retries were spent`;
        throw new IdempotentRequestError(`${method} ${url} failed: ${why} after ${attempts} attempt(s) without an answer`, key, attempts, {
          cause: failure,
        });
      }
      await sleep(waitMs, opts.signal);
    }
  }

  return {
    request,
    post: (path, body, opts) => request('POST', path, body, opts),
    patch: (path, body, opts) => request('PATCH', path, body, opts),
  };
}

/** The guard's 409 of a request still in progress (its code says so): waited out, spending no retry. */
function isInProgress(answer: IdempotentResponse<unknown>): boolean {
  const body = answer.body as { code?: unknown } | undefined;
  return answer.status === 409 && typeof body === 'object' && body !== null && body.code === IN_PROGRESS_CODE;
}

/**
 * The answer's text, or undefined past `maxBytes` (reading no further). A WHATWG stream body (the
 * global fetch, undici), else one read by async iteration (node-fetch's Node.js stream, which has
 * no `getReader`: every answer was taken for a network error, and a call whose every attempt got
 * its 201 threw "without an answer"; an adversarial helper), else the Response's own `text()`.
 */
async function readText(res: Response, maxBytes: number): Promise<string | undefined> {
  const body = res.body as unknown;
  if (!body) return '';
  const decoder = new TextDecoder();
  let text = '';
  let bytes = 0;
  /** Adds a chunk; false once past `maxBytes`. */
  const add = (chunk: Uint8Array | string): boolean => {
    const bytesOf = typeof chunk === 'string' ? new TextEncoder().encode(chunk) : chunk;
    bytes += bytesOf.byteLength;
    if (bytes > maxBytes) return false;
    text += decoder.decode(bytesOf, { stream: true });
    return true;
  };
  if (typeof (body as ReadableStream<Uint8Array>).getReader === 'function') {
    const reader = (body as ReadableStream<Uint8Array>).getReader();
    for (;;) {
      const { done, value } = await reader.read();
      if (done) return text + decoder.decode();
      if (!add(value)) {
        await reader.cancel().catch(() => undefined);
        return undefined;
      }
    }
  }
  if (typeof (body as AsyncIterable<Uint8Array>)[Symbol.asyncIterator] === 'function') {
    // Leaving the loop early ends the iteration, which destroys a Node.js stream.
    for await (const chunk of body as AsyncIterable<Uint8Array | string>) if (!add(chunk)) return undefined;
    return text + decoder.decode();
  }
  const whole = await res.text();
  return add(whole) ? text + decoder.decode() : undefined;
}

/**
 * The body as JSON where its type says so, else the text. JSON that does not parse in an answer
 * without a Content-Length (ended by closing the connection, which a proxy can cut anywhere) is
 * taken for a cut answer: the attempt failed, and the retry gets the replay. It was returned as a
 * 201 whose body was the first half of the JSON, as text (an adversarial helper).
 */
function decodeBody(text: string, headers: Headers, status: number, method: string): unknown {
  const contentType = headers.get('content-type');
  const json = contentType !== null && /[/+]json\b/i.test(contentType);
  if (text === '') {
    // An empty JSON answer with no Content-Length was cut before its first byte (it was returned
    // as a success with no body, and the caller lost the answer a retry replays; an adversarial
    // helper); one that has no body by its status or method is whole.
    if (json && !headers.has('content-length') && method !== 'HEAD' && ![204, 205, 304].includes(status)) {
      throw new Error('the answer was cut: its JSON is empty, and no Content-Length says it is whole');
    }
    return undefined;
  }
  if (!json) return text;
  try {
    return JSON.parse(text) as unknown;
  } catch (error) {
    if (!headers.has('content-length')) throw new Error('the answer was cut: its JSON does not parse, and no Content-Length says it is whole', { cause: error });
    return text;
  }
}

/**
 * A signal that aborts when either does, with the reason of the one that did, made for one
 * attempt and let go after it (`release`). `AbortSignal.any()` on a long-lived signal of the
 * caller's (a process-wide shutdown signal) kept a reference to every attempt's signal on Node 20
 * (nodejs/node#55351; an adversarial helper: +6 MB of heap per 100,000 calls).
 */
function eitherSignal(caller: AbortSignal, attempt: AbortSignal): { signal: AbortSignal; release(): void } {
  const controller = new AbortController();
  const onCaller = () => controller.abort(caller.reason);
  const onAttempt = () => controller.abort(attempt.reason);
  const release = () => {
    caller.removeEventListener('abort', onCaller);
    attempt.removeEventListener('abort', onAttempt);
  };
  if (caller.aborted) onCaller();
  else if (attempt.aborted) onAttempt();
  else {
    caller.addEventListener('abort', onCaller, { once: true });
    attempt.addEventListener('abort', onAttempt, { once: true });
  }
  return { signal: controller.signal, release };
}

/**
 * Headers as fetch takes them: the global `Headers`, any iterable of pairs (an array, a `Map`,
 * undici's or node-fetch's own `Headers`), or a record; a header given as `undefined` (in a
 * record or a pair) is none (`new Headers()` writes "undefined"). An iterable other than the global
 * `Headers` was read as a record, which has no entries: the caller's key and Authorization were
 * dropped, and a re-sent operation went under a new key and ran twice (an adversarial helper).
 */
function headersOf(init: HeadersLike | undefined): Headers {
  if (init === undefined || init instanceof Headers) return new Headers(init);
  if (typeof (init as Partial<Iterable<unknown>>)[Symbol.iterator] === 'function') {
    return new Headers([...(init as Iterable<[string, string | undefined]>)].filter((pair) => pair[1] !== undefined) as [string, string][]);
  }
  return new Headers(Object.fromEntries(Object.entries(init).filter(([, value]) => value !== undefined)) as HeadersLike);
}

/** `work`, or a rejection with the signal's reason as soon as it aborts (`work` is left to end alone). */
function untilAborted<T>(work: Promise<T>, signal: AbortSignal): Promise<T> {
  if (signal.aborted) {
    work.catch(() => undefined);
    return Promise.reject(signal.reason);
  }
  return new Promise<T>((resolve, reject) => {
    const onAbort = () => reject(signal.reason);
    signal.addEventListener('abort', onAbort, { once: true });
    work.then(resolve, reject).finally(() => signal.removeEventListener('abort', onAbort));
  });
}

/**
 * Waits `ms`, in steps a timer can hold (a `Retry-After` may ask for more), or rejects with the
 * signal's reason as soon as it aborts.
 */
function sleep(ms: number, signal: AbortSignal | undefined): Promise<void> {
  return new Promise((resolve, reject) => {
    if (signal?.aborted) return reject(signal.reason);
    let timer: ReturnType<typeof setTimeout>;
    const onAbort = () => {
      clearTimeout(timer);
      reject(signal!.reason);
    };
    const wait = (left: number) => {
      timer = setTimeout(() => {
        if (left > MAX_TIMER_MS) return wait(left - MAX_TIMER_MS);
        signal?.removeEventListener('abort', onAbort);
        resolve();
      }, Math.min(left, MAX_TIMER_MS));
    };
    wait(ms);
    signal?.addEventListener('abort', onAbort, { once: true });
  });
}
