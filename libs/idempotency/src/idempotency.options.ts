import type { ExecutionContext } from '@nestjs/common';
import type { Cluster, Redis, RedisOptions } from 'ioredis';
import type { ErrorFormat } from './errors/problem-details.js';
import type { IdempotencyEventListener } from './events/idempotency-event.js';
import type { PrometheusMetricsOptions } from './metrics/prometheus-metrics.js';
import type { IdempotencyStore } from './stores/idempotency-store.js';
import type { LocalCacheOptions } from './stores/local-cache/local-cache-options.js';
import type { SkippedMessageHandler } from './messages/skipped-message.js';

/** What to do when the store cannot be reached: run unguarded ('open') or answer 503 ('closed'). */
export type FailMode = 'open' | 'closed';

/** How anonymous calls are keyed (see `IdempotencyModuleOptions.anonymous`). */
export type AnonymousPolicy = 'client-key' | 'address';

/**
 * Which answers to a handler's error are saved (see `IdempotencyModuleOptions.saveStatuses`): a
 * list of 4xx statuses, or a test each 4xx status is put to.
 */
export type SaveStatuses = readonly number[] | ((status: number) => boolean);

/**
 * Who a request belongs to, as `getUser` gives it: an id (a non-empty string, a finite number, a
 * bigint), or the parts that make one together (`[tenantId, sub]`), each such an id. Parts are
 * kept apart in the key, and a missing part (`null`, `undefined`, empty) refuses the call, where a
 * template (`${tenant}:${id}`) writes `t1:undefined` for every user whose `id` is missing. Parts
 * that are all missing, on a request without a user, are an anonymous call.
 */
export type IdempotencyUserId = string | number | bigint | readonly (string | number | bigint | null | undefined)[];

/** Reads the key from the request; return undefined when there is none. */
export type KeyResolver = (ctx: ExecutionContext) => string | undefined;

/** Options of `IdempotencyModule.forRoot()` / `forRootAsync()`. */
export interface IdempotencyModuleOptions {
  /**
   * Where claims and responses live. One of:
   * - an `IdempotencyStore` instance (memory, Redis, your own);
   * - `{ redis: client }`: an ioredis `Redis` or `Cluster` you created (you close it);
   * - `{ redis: url | RedisOptions }`: the module creates and closes the client, with short
   *   timeouts and no offline queue so an outage never hangs a request.
   * With `{ redis, waitForReplicas }` every claim and completion waits for that many replicas
   * (see `RedisIdempotencyStoreOptions.waitForReplicas`).
   * Default: the memory store (one process only; a warning is logged once).
   */
  store?:
    | IdempotencyStore
    | { redis: Redis | Cluster | string | RedisOptions; waitForReplicas?: { replicas: number; timeoutMs: number } };
  /** The request header that carries the key on routes without `idempotentKey`. Default `Idempotency-Key`. */
  keyHeader?: string;
  /** First segment of every key. Default `no_repeat`. */
  keyPrefix?: string;
  /** How long a completed response is replayed, in seconds. Default 3600. */
  expireSeconds?: number;
  /**
   * How long a claim holds without renewal, in seconds. Default 10. While the handler runs the
   * guard renews the claim every third of the lease, so this is how soon the key of a crashed
   * process frees, not how long a handler may run (see `maxHoldSeconds`).
   */
  leaseSeconds?: number;
  /**
   * The longest a running handler keeps its claim, in seconds. Default 300. Past it the guard
   * stops renewing, and the key frees one lease later (logged and counted as a lost lease).
   * Set it to `leaseSeconds` for a lease that is never renewed; a value below `leaseSeconds`
   * counts as `leaseSeconds` (a claim always holds one whole lease).
   */
  maxHoldSeconds?: number;
  /**
   * The longest `app.close()` (a signal under `enableShutdownHooks()`) waits for the guarded runs
   * in flight to settle and save, in seconds. Default: no bound but each run's `maxHoldSeconds`.
   * Past it the guard logs the runs left, by handler, and lets the app close: their keys stay
   * claimed until their leases end (a retry gets 409 meanwhile), then a retry runs them again, as
   * after a crash. Set it below your platform's grace period (Kubernetes' 30 s by default).
   */
  shutdownWaitSeconds?: number;
  /**
   * Who the request belongs to (a key segment, so users never share records). Default:
   * `request.user.id`, else `request.user.sub` (Nest's JWT recipe); where Passport is registered
   * with another `property`, that property is read first. Return undefined for an
   * anonymous call (see `anonymous`), and the parts for a user known by several
   * (`[user.tenantId, user.sub]`: a missing part refuses the call, never merges users). An authenticated request (`request.user` set) whose id
   * cannot be resolved is refused with 500 `IDEMPOTENCY_USER_UNRESOLVED`, never keyed by address:
   * give `getUser` for another user shape (e.g. `(ctx) => ctx.switchToHttp().getRequest().user?.userId`).
   */
  getUser?: (ctx: ExecutionContext) => IdempotencyUserId | undefined;
  /**
   * How calls with no user are keyed. Default `'client-key'`: only by a key the client chose
   * (every anonymous caller shares one namespace, so only a caller who sends a key gets that
   * key's response); a fingerprint-keyed route answers an anonymous call without a key 400
   * `IDEMPOTENCY_KEY_MISSING`. `'address'`: by the client address the adapter trusts (Express
   * `trust proxy`, Fastify `trustProxy`): callers behind one NAT or proxy then share records.
   */
  anonymous?: AnonymousPolicy;
  /**
   * Largest response body saved for replay, in bytes. A bigger answer is still sent, and its
   * duplicates get 409 `IDEMPOTENCY_RESPONSE_NOT_REPLAYABLE` (the handler never runs twice).
   * Default 1,048,576 (1 MiB).
   */
  maxResponseBytes?: number;
  /**
   * Whether a call without a key is refused (400 `IDEMPOTENCY_KEY_MISSING`, default `true`) or
   * runs unguarded (`false`: for routes where clients may send a key but need not).
   */
  required?: boolean;
  /** Store outage policy for routes that do not set their own. Default 'open'. */
  failMode?: FailMode;
  /**
   * How the guard's HTTP refusals (400, 409, 422, 503, 500) are written. `'nest'` (default):
   * Nest's JSON plus `code`, `{ statusCode, error, message, code }`. `'problem+json'`: RFC 9457
   * problem details, `{ type, title, status, detail, code }`, sent as
   * `Content-Type: application/problem+json` (`type` is `tag:nestjs-idempotency,2026:<code>`,
   * `detail` the message). `@ContentDigest()`'s refusals follow it too. Messages (RPC) keep
   * `{ code, message }`. Per route too.
   */
  errorFormat?: ErrorFormat;
  /**
   * Settles a message whose handler the guard did not run (a duplicate, one in progress, a
   * refusal), on a transport where the handler acknowledges each message itself: RabbitMQ with
   * `noAck: false` takes `settleRmqMessage`. Default: nothing (the transport acknowledges).
   */
  onSkippedMessage?: SkippedMessageHandler;
  /**
   * Response headers saved and replayed (case-insensitive).
   * Default `content-type`, `location`, `etag`, `content-location`, `content-disposition`, `cache-control`.
   * `set-cookie` is never saved; `content-encoding` and `vary` always are (a replay's `Vary` also
   * names what this response's own middleware adds, such as CORS's `Origin`).
   */
  replayHeaders?: string[];
  /** Fields removed at any depth before fingerprinting (e.g. `timestamp`, `nonce`). Default none. */
  ignoreFields?: string[];
  /**
   * The 4xx answers to a handler's error that are saved and replayed like a success, as Stripe
   * does: a list (`[409, 402]`), or a function of the status (`(status) => status !== 429`).
   * Once the handler itself has begun, an error it throws (an `HttpException`, or one the app's
   * exception filter answers) whose answer has such a status is saved as the client received it,
   * after the filters: a retry with the key gets the same status, body bytes and allowlisted
   * headers, with `Idempotent-Replayed: true`, and the handler does not run again.
   * Never saved, whatever this says: an answer before the handler began (a Nest guard's 401 or
   * 403, a pipe's 400 such as `ValidationPipe`'s, a parameter decorator's error), any 5xx, and
   * any status outside 400-499: the key is released and a retry runs the handler. HTTP only: a
   * message handler that throws releases its key. Default none: every error releases the key.
   */
  saveStatuses?: SaveStatuses;
  /** Maximum entries of the default memory store. Default 100,000. */
  memoryMaxEntries?: number;
  /**
   * Maximum bytes the default memory store's records hold (keys and saved answers). An answer
   * past it is kept without its body and headers (not replayable: never a second run), a new key
   * past it follows the outage policy. Default 64 MiB.
   */
  memoryMaxBytes?: number;
  /**
   * Keeps the completed records this process has replayed (a replay the store answered) in
   * memory, so that replaying one again costs no store round trip; never the answers it saves,
   * so first requests cost what they cost without it. Default off. `true` for the
   * default bounds, or `{ maxEntries, maxBytes }`: 10,000 records and 32 MiB (the key, body and
   * header texts plus 300 bytes a record and 24 a header), least recently used out first. An entry never answers
   * past its record's retention, and goes when the record is forgotten, replaced, deleted or
   * flushed, from any instance: Redis tracks the keys the cache read (client-side caching), over
   * one more connection per process. The Redis store on a single primary only: a Cluster client,
   * the PostgreSQL store or a store of your own refuse it at start-up; the memory store needs none.
   */
  localCache?: boolean | LocalCacheOptions;
  /**
   * Prometheus metrics (needs `prom-client`): `true` for the global registry, or
   * `{ registry, prefix }`. Default off; `IdempotencyCounters` keeps totals either way.
   */
  metrics?: boolean | PrometheusMetricsOptions;
  /**
   * Called with each of the guard's events (`IdempotencyEvent`: acquired, completed, replayed,
   * in_progress, key_reused, released, ...), synchronously on the request path. What it throws is
   * logged, never answered. Default none; providers subscribe through `IdempotencyEvents`.
   */
  onEvent?: IdempotencyEventListener;
}

/** Options of `@NoRepeatSubmit()`; each overrides the module's option of the same name. */
export interface NoRepeatSubmitOptions {
  /** How long the completed response is replayed, in seconds. */
  expireSeconds?: number;
  /**
   * Where the key comes from: an expression such as `#body.orderNo`, `#headers['x-request-id']`,
   * `#query.ref`, `#params.id`, `#user.tenantId` (nested paths allowed), or a function.
   * Default: the `Idempotency-Key` header.
   */
  idempotentKey?: string | KeyResolver;
  /** With no key in the request, use the request fingerprint as the key instead of answering 400. */
  useRequestFingerprint?: boolean;
  /** How long the claim holds without renewal, in seconds (renewed while the handler runs). */
  leaseSeconds?: number;
  /** The longest a running handler keeps its claim, in seconds. */
  maxHoldSeconds?: number;
  /** Store outage policy of this route. */
  failMode?: FailMode;
  /** How this route's HTTP refusals are written (see the module option). */
  errorFormat?: ErrorFormat;
  /** Fields removed at any depth before fingerprinting. */
  ignoreFields?: string[];
  /** Largest response body saved for replay, in bytes (see the module option). */
  maxResponseBytes?: number;
  /** The request header that carries the key (see the module option). */
  keyHeader?: string;
  /** Whether a call without a key is refused (400) or runs unguarded (see the module option). */
  required?: boolean;
  /**
   * The 4xx answers to this handler's errors that are saved and replayed like a success (see the
   * module option); `[]` saves none on a route under a module that saves some.
   */
  saveStatuses?: SaveStatuses;
  /** Calls for which this returns true run unguarded (e.g. internal callers, dry runs). */
  skipIf?: (ctx: ExecutionContext) => boolean;
  /**
   * On a controller: the HTTP methods of its routes that it guards. Default POST, PUT, PATCH,
   * DELETE (reads are not guarded). Message handlers are guarded either way.
   */
  methods?: string[];
  /**
   * A duplicate that arrives while the first request is processing waits up to this many
   * milliseconds for its result (pushed by the store, no polling on Redis) and gets the replay
   * instead of a 409; past the bound it gets the 409. Default 0: answer 409 at once; on an
   * `@EventPattern` handler with no `onSkippedMessage`, on a store that pushes settlements (Redis,
   * memory), as long as the first may hold the key (`maxHoldSeconds` and a lease): a copy
   * dropped while the first ran was lost when it failed.
   */
  waitForResultMs?: number;
}
