import { Logger, type OnApplicationShutdown, type OnModuleInit } from '@nestjs/common';
import type { Cluster, Redis } from 'ioredis';
import { randomUUID } from 'node:crypto';
import type { Socket } from 'node:net';
import { IdempotencyConfigError, IdempotencyNotARecordError, IdempotencyStoreError } from '../../errors/idempotency.errors.js';
import { DEFAULTS } from '../../idempotency.constants.js';
import {
  IdempotencyStore,
  type ClaimInput,
  type ClaimResult,
  type ForgetResult,
  type SavedResponse,
  type SettleWatch,
  type StoredRecord,
} from '../idempotency-store.js';
import { SettleWatchers } from '../settle-watchers.js';
import { withinDeadline, type DeadlineConnection } from '../within-deadline.js';
import { CLAIM_WAIT_LUA } from './claim-wait.lua.js';
import { whenWritesSent } from './coalesce-writes.js';
import { COMPLETE_LUA } from './complete.lua.js';
import { FORGET_LUA } from './forget.lua.js';
import {
  decodeRecord,
  encodeProcessing,
  encodeResponse,
  toStoredRecord,
  tokenPrefix,
  type DecodedRecord,
} from './redis-record.js';
import { RELEASE_LUA } from './release.lua.js';
import { RENEW_LUA } from './renew.lua.js';

/** How long the start-up check's probe key lives at most, should its deletion not land. */
const PROBE_LEASE_MS = 5000;

/**
 * The scripts as commands on the client (registered with `defineCommand`, sent as EVALSHA). Their
 * integer replies, and Redis's, are read through `Number()`: a client with `stringNumbers` gives
 * them as strings.
 */
interface ScriptedClient {
  idempotencyClaimWait(key: string, processing: string, leaseMs: number): Promise<[record: string, pttlMs: number] | null>;
  idempotencyComplete(key: string, prefix: string, response: string, retentionMs: number, channel: string): Promise<0 | 1>;
  idempotencyRelease(key: string, prefix: string, channel: string): Promise<0 | 1>;
  idempotencyRenew(key: string, prefix: string, leaseMs: number, leaseEndMs: number): Promise<0 | 1>;
  idempotencyForget(key: string): Promise<-1 | 0 | 1 | 2>;
}

export interface RedisIdempotencyStoreOptions {
  /** Quit the client on application shutdown (true when the module created it). Default false. */
  ownsClient?: boolean;
  /** How long start-up waits for the first connection, in milliseconds. Default 1000. */
  readyTimeoutMs?: number;
  /** Pub/sub channel on which settled keys that someone waits for are published. */
  settleChannel?: string;
  /**
   * Durability across a failover: after a claim, a renewal and a completion, `WAIT` until this
   * many replicas acknowledged the write (one more round trip each). A claim not acknowledged in
   * time is released and reported as a store error (the outage policy applies); a completion not
   * acknowledged fails (the guard tries it again until the lease ends); a renewal not
   * acknowledged is logged. Single primary with replicas only: not on a Cluster
   * client.
   */
  waitForReplicas?: { replicas: number; timeoutMs: number };
  /**
   * The guard's key prefix (the module's `keyPrefix`, which the module passes; default
   * `no_repeat`): the start-up check claims a key under it, as a Redis user narrowed to it may.
   */
  keyPrefix?: string;
}

/**
 * Redis store (Redis 7.0 or later): one round trip per operation, TTLs set by Redis. A claim is
 * the plain command `SET key <processing> NX PX <lease> GET`: it claims a free key, or returns
 * the record that holds it, so a duplicate is one command too. Completing, releasing and renewing
 * are Lua scripts that check the owner's token first (fencing); forgetting is one that deletes
 * only a completed record. One string per record (`redis-record.ts`). Works on a single node and
 * on a Cluster (every command touches one key).
 */
export class RedisIdempotencyStore extends IdempotencyStore implements OnModuleInit, OnApplicationShutdown {
  private readonly logger = new Logger(RedisIdempotencyStore.name);
  private readonly scripts: ScriptedClient;
  private readonly channel: string;
  private readonly watchers = new SettleWatchers();
  private subscriber: Redis | Cluster | undefined;
  private subscribing: Promise<void> | undefined;
  /** The first connection while it is being made (`firstConnection`). */
  private connecting: Promise<void> | undefined;
  /** The guard's key prefix, where the start-up check probes (`RedisIdempotencyStoreOptions.keyPrefix`, `useKeyPrefix`). */
  private keyPrefix: string | undefined;
  /** The store's own bound on each command, for a client that has none (see `ownDeadlineMs`). */
  private readonly deadlineMs: number | undefined;
  /** The store's client as its commands' bounds see it: when a command left, and what came back since. */
  private readonly connection: DeadlineConnection = {
    whenSent: (arm) => whenWritesSent(this.client, arm),
    bytesRead: () => (this.client as { stream?: Socket }).stream?.bytesRead,
  };

  constructor(
    readonly client: Redis | Cluster,
    private readonly options: RedisIdempotencyStoreOptions = {},
  ) {
    super();
    const commands: Record<string, string> = {
      idempotencyClaimWait: CLAIM_WAIT_LUA,
      idempotencyComplete: COMPLETE_LUA,
      idempotencyRelease: RELEASE_LUA,
      idempotencyRenew: RENEW_LUA,
      idempotencyForget: FORGET_LUA,
    };
    for (const [name, lua] of Object.entries(commands)) {
      if (!(name in client)) client.defineCommand(name, { numberOfKeys: 1, lua });
    }
    this.scripts = client as unknown as ScriptedClient;
    this.channel = options.settleChannel ?? 'idempotency:settled';
    this.keyPrefix = options.keyPrefix;
    this.deadlineMs = ownDeadlineMs(client);
    if (options.waitForReplicas && isCluster(client)) {
      throw new IdempotencyConfigError('RedisIdempotencyStore: waitForReplicas needs a single-primary client, not a Cluster');
    }
  }

  async claim({ key, token, fingerprint, leaseMs, wait }: ClaimInput): Promise<ClaimResult> {
    const processing = encodeProcessing(token, fingerprint, Date.now() + leaseMs);
    let held: string | null;
    let pttlMs: number | undefined;
    try {
      [held, pttlMs] = wait
        ? ((await this.run(() => this.scripts.idempotencyClaimWait(key, processing, leaseMs))) ?? [null])
        : [await this.run(() => this.client.set(key, processing, 'PX', leaseMs, 'NX', 'GET'))];
      if (pttlMs !== undefined) pttlMs = Number(pttlMs);
    } catch (error) {
      // At its maxmemory (noeviction) Redis refuses every write, a claim too, but still reads: a
      // key it holds is answered from its record (a replay, a 409); only a new key is refused.
      if (!(error instanceof IdempotencyStoreError && /\bOOM\b/.test(error.message))) throw error;
      const found = await this.read(key);
      if (!found) throw error;
      return claimResultOf(found.record, fingerprint, leaseLeft(found.record, found.ttlMs, leaseMs));
    }
    if (held === null) {
      await this.replicate(() => this.release(key, token));
      return { status: 'acquired', token };
    }
    const record = this.decode(held);
    // This very claim, landed already: ioredis sent it again after a dropped connection lost its
    // reply (a client with its defaults re-sends such commands), and the record holds our token.
    if (record.state === 'processing' && record.token === token) {
      await this.replicate(() => this.release(key, token));
      return { status: 'acquired', token };
    }
    return claimResultOf(record, fingerprint, leaseLeft(record, pttlMs, leaseMs));
  }

  /**
   * A client with an offline queue keeps a command made while Redis is away, and sends it once
   * Redis is back, whatever its caller was told; one that sends unanswered commands again after a
   * reconnect (ioredis's default), and keeps them past the first (`maxRetriesPerRequest` not 0),
   * sends a claim whose connection dropped. The module's own client does neither.
   */
  override get deliversLate(): boolean {
    if (isCluster(this.client)) {
      const { enableOfflineQueue, redisOptions } = this.client.options;
      return enableOfflineQueue !== false || redisOptions?.autoResendUnfulfilledCommands !== false;
    }
    const { enableOfflineQueue, autoResendUnfulfilledCommands, maxRetriesPerRequest } = this.client.options;
    return enableOfflineQueue !== false || (autoResendUnfulfilledCommands !== false && maxRetriesPerRequest !== 0);
  }

  async complete(key: string, token: string, response: SavedResponse, retentionMs: number): Promise<boolean> {
    const reply = Number(
      await this.run(() => this.scripts.idempotencyComplete(key, tokenPrefix(token), encodeResponse(response), retentionMs, this.channel)),
    );
    // Not acknowledged, the save fails (the guard tries it again until the lease ends: the same
    // save, sent again, answers 1 and waits again). Only logged, it was lost in a failover, whose
    // promoted replica held the claim: a retry ran the handler again (an adversarial helper).
    if (reply === 1) await this.replicate();
    return reply === 1;
  }

  async release(key: string, token: string): Promise<boolean> {
    return Number(await this.run(() => this.scripts.idempotencyRelease(key, tokenPrefix(token), this.channel))) === 1;
  }

  async renew(key: string, token: string, leaseMs: number): Promise<boolean> {
    const reply = Number(await this.run(() => this.scripts.idempotencyRenew(key, tokenPrefix(token), leaseMs, Date.now() + leaseMs)));
    if (reply === 1) await this.replicate().catch((error: Error) => this.logger.warn(error.message));
    return reply === 1;
  }

  override async forget(key: string): Promise<ForgetResult> {
    const reply = Number(await this.run(() => this.scripts.idempotencyForget(key)));
    if (reply === -1) return { forgotten: false, reason: 'not_a_record' };
    if (reply === 0) return { forgotten: false, reason: 'absent' };
    if (reply === 2) return { forgotten: false, reason: 'in_progress' };
    await this.replicate().catch((error: Error) => this.logger.warn(error.message));
    return { forgotten: true };
  }

  /** With `waitForReplicas`, waits for the replicas; on a shortfall runs `undo` and throws. */
  private async replicate(undo?: () => Promise<unknown>): Promise<void> {
    const wanted = this.options.waitForReplicas;
    if (!wanted) return;
    const acked = Number(await this.run(() => (this.client as Redis).wait(wanted.replicas, wanted.timeoutMs), wanted.timeoutMs));
    if (acked >= wanted.replicas) return;
    await undo?.();
    throw new IdempotencyStoreError(
      `Only ${acked} of ${wanted.replicas} replicas acknowledged the write within ${wanted.timeoutMs} ms`,
    );
  }

  override async ping(): Promise<void> {
    await this.run(() => this.client.ping());
  }

  /** Pushed: one subscriber connection per store hears the keys the scripts publish. */
  override async watch(key: string): Promise<SettleWatch> {
    await (this.subscribing ??= this.subscribe().catch((error: unknown) => {
      this.subscribing = undefined;
      throw new IdempotencyStoreError(`Redis subscribe failed: ${(error as Error).message}`, { cause: error });
    }));
    return this.watchers.watch(key);
  }

  private async subscribe(): Promise<void> {
    // The offline queue lets SUBSCRIBE wait for the new connection (the module's client has none).
    // A SUBSCRIBE that failed is sent again on the same connection, which keeps its listeners.
    this.subscriber ??= this.newSubscriber();
    // Bounded as the store's commands are: a waiter must not hang on a Redis that went away.
    // Bytes coming in on the store's client say nothing of the subscriber's: a plain bound.
    await this.bounded(this.subscriber.subscribe(this.channel), 0, null);
  }

  private newSubscriber(): Redis | Cluster {
    // It subscribes again after a reconnect, whatever the client's `autoResubscribe` says (a waiter
    // otherwise slept to its bound after any reconnect).
    const subscriber = isCluster(this.client)
      ? this.client.duplicate(undefined, { enableOfflineQueue: true })
      : this.client.duplicate({ enableOfflineQueue: true, autoResubscribe: true });
    subscriber.on('error', () => undefined);
    // The scripts publish the key as Redis holds it: with the client's keyPrefix, which the
    // watchers' keys (as the guard names them) lack. Another prefix's keys are not ours.
    const prefix = this.client.options.keyPrefix ?? '';
    subscriber.on('message', (_channel: string, key: string) => {
      if (key.startsWith(prefix)) this.watchers.notify(key.slice(prefix.length));
    });
    return subscriber;
  }

  async get(key: string): Promise<StoredRecord | undefined> {
    const found = await this.read(key);
    return found && toStoredRecord(found.record, found.ttlMs);
  }

  /** The record under `key` and its PTTL (a read: Redis answers it at its maxmemory too). */
  private async read(key: string): Promise<{ record: DecodedRecord; ttlMs: number } | undefined> {
    const [value, ttlMs] = await this.run(() => Promise.all([this.client.get(key), this.client.pttl(key)]));
    return value === null ? undefined : { record: this.decode(value), ttlMs: Number(ttlMs) };
  }

  /**
   * Waits (bounded) for the first connection so the first requests are guarded, then checks
   * Redis's eviction policy; never fails start-up.
   */
  async onModuleInit(): Promise<void> {
    this.warnOfSentinelFailover();
    await this.firstConnection();
    // A Redis that comes up later is checked when the client first gets ready.
    if ((this.client.status as string) === 'ready') await this.checkServer();
    else this.client.once('ready', () => void this.checkServer());
  }

  /**
   * The module's `keyPrefix`, told to a store handed to it as an instance: the keys its claims
   * have, whatever the store's options say (helper-213: probed under the default prefix, a user
   * narrowed to the module's was told it may not claim; helper-216: under the options' own).
   */
  useKeyPrefix(prefix: string): void {
    this.keyPrefix = prefix;
  }

  private async checkServer(): Promise<void> {
    await this.warnOfEviction();
    await this.warnOfRefusals();
  }

  /**
   * What the Redis user's ACL refuses, said at start-up from a probe key under the guard's prefix
   * (claimed and renewed as a request's claim is, then deleted; an ACL narrowed to the prefix
   * allows it, helper-212):
   * - a claim (no `SET`, or key patterns that leave the prefix out; or the whole Redis: a
   *   read-only replica, `maxmemory` under `noeviction`): no claim lands, and every request
   *   follows the routes' `failMode` (under `'open'`, the default, every duplicate runs);
   * - the scripts (`-@scripting`): claims land, but no answer is saved and no claim renewed, so
   *   every duplicate runs the handler again once its lease ends.
   */
  private async warnOfRefusals(): Promise<void> {
    const prefix = this.keyPrefix ?? DEFAULTS.keyPrefix;
    const key = `${prefix}:startup-check:${randomUUID()}`;
    const token = randomUUID();
    const refused = (error: unknown) => /\bNOPERM\b/.test((error as Error).message);
    try {
      await this.run(() => this.client.set(key, encodeProcessing(token, '', Date.now() + PROBE_LEASE_MS), 'PX', PROBE_LEASE_MS, 'NX'));
    } catch (error) {
      const { message } = error as Error;
      const outcome =
        "no claim of a new key lands, so those requests follow the routes' failMode (under 'open', the default, every duplicate runs the handler)";
      if (refused(error)) {
        this.logger.error(
          `This Redis user may not claim the guard's keys (${key}: ${message}): ${outcome}. Grant it SET and the scripts ` +
            `(+@scripting) on keys ~${prefix}:*.`,
        );
      } else if (/\b(READONLY|OOM|NOREPLICAS|MISCONF)\b/.test(message)) {
        // A replica (the client points at the wrong node), a Redis at its maxmemory under
        // noeviction, short of its min-replicas-to-write, or stopped by a failed background save.
        this.logger.error(`This Redis refuses the guard's claims (${message}): ${outcome}.`);
      }
      return;
    }
    try {
      await this.run(() => this.scripts.idempotencyRenew(key, tokenPrefix(token), PROBE_LEASE_MS, Date.now() + PROBE_LEASE_MS));
    } catch (error) {
      if (!refused(error)) return;
      this.logger.error(
        `This Redis user may not run the guard's scripts (${(error as Error).message}): claims land, but no answer is saved ` +
          'and no claim renewed, so every duplicate runs the handler again once its lease ends. Grant it +@scripting ' +
          '(EVAL and EVALSHA).',
      );
    } finally {
      // The probe's own key; its lease ends it anyway.
      await this.run(() => this.client.del(key)).catch(() => undefined);
    }
  }

  /**
   * Behind Sentinel, a failover loses the writes the old primary took and had not replicated:
   * Sentinel demotes it seconds after promoting the replica, and a client still on it meanwhile
   * writes there (an adversarial helper: `SENTINEL FAILOVER` during a storm, 14 of 16 keys ran
   * twice, fail-closed, no error anywhere; with `waitForReplicas` none). Said at start-up when
   * the client is a Sentinel client and the store does not wait for replicas.
   */
  private warnOfSentinelFailover(): void {
    const sentinels = (this.client.options as { sentinels?: unknown[] | null }).sentinels;
    if (!Array.isArray(sentinels) || sentinels.length === 0 || this.options.waitForReplicas) return;
    this.logger.warn(
      'The Redis client goes through Sentinel, and the store does not wait for replicas: a failover loses the claims and ' +
        'answers the old primary took and had not replicated, and their duplicates run the handler again. Pass ' +
        "waitForReplicas (the store's option, or the module's { redis, waitForReplicas }), and give the client failoverDetector: true.",
    );
  }

  /**
   * A Redis with a `maxmemory` and a policy that evicts keys (`allkeys-*`, and `volatile-*`:
   * every record has a TTL) deletes records and running claims under memory pressure, with no
   * error: the next duplicate runs again. Said once at start-up (read from `INFO memory`, which
   * managed Redis services allow where they refuse `CONFIG GET`), for each primary of a Cluster.
   */
  private async warnOfEviction(): Promise<void> {
    const nodes = isCluster(this.client) ? this.client.nodes('master') : [this.client];
    for (const node of nodes) {
      try {
        const info = await this.run(() => node.info('memory'));
        const maxmemory = Number(/^maxmemory:(\d+)/m.exec(info)?.[1] ?? 0);
        const policy = /^maxmemory_policy:(\S+)/m.exec(info)?.[1];
        if (maxmemory > 0 && policy !== undefined && policy !== 'noeviction') {
          this.logger.warn(
            `Redis${nodes.length > 1 ? ` ${node.options.host}:${node.options.port}` : ''} evicts keys when it reaches its maxmemory ` +
              `(maxmemory-policy ${policy}): a record or a running claim it evicts lets a duplicate run the handler again. ` +
              'Set maxmemory-policy noeviction on the Redis that holds idempotency records (at maxmemory it then refuses ' +
              "new claims, which follow the routes' failMode).",
          );
        }
      } catch {
        // INFO refused (an ACL without it): nothing to say.
      }
    }
  }

  /**
   * The first connection of a client not connected yet (the module's is lazy, see createStore),
   * made once, from `onModuleInit` or from the first command, whichever comes first: a hybrid
   * app's microservices take messages before the module's init hooks run
   * (`startAllMicroservices()` before `listen()`, as Nest's docs order them), and each of those
   * commands failed at once on the unconnected client, as an outage: under fail-open a backlog of
   * one message's copies ran it 11 to 20 times (an adversarial helper). Bounded as `ready` is.
   */
  private firstConnection(): Promise<void> {
    return (this.connecting ??= this.ready().finally(() => {
      this.connecting = undefined;
    }));
  }

  private async ready(): Promise<void> {
    if (this.client.status === 'ready') return;
    // A client the module opened is created lazily (see createStore); a failed first connection
    // is retried by the client's own strategy, and the wait below is bounded either way.
    if (this.client.status === 'wait') this.client.connect().catch(() => undefined);
    const timeoutMs = this.options.readyTimeoutMs ?? 1000;
    const ready = new Promise<void>((resolve) => {
      const timer = setTimeout(done, timeoutMs);
      this.client.once('ready', done);
      function done() {
        clearTimeout(timer);
        resolve();
      }
    });
    await ready;
    if ((this.client.status as string) !== 'ready') {
      this.logger.warn(`Redis is not ready after ${timeoutMs} ms; requests follow the outage policy until it is`);
    }
  }

  /** Quits its connections, each within the command bound: a Redis that went silent must not hold the app's shutdown. */
  async onApplicationShutdown(): Promise<void> {
    const clients = [this.subscriber, this.options.ownsClient ? this.client : undefined];
    await Promise.all(
      clients.map((client) => client && withinDeadline(client.quit(), DEFAULTS.redisCommandTimeoutMs).catch(() => client.disconnect())),
    );
  }

  /**
   * `work` within the store's own bound, when it keeps one (plus `extraMs`: a WAIT's own timeout),
   * sent on `connection` (the store's client; null: another, whose bytes the bound does not watch).
   */
  private bounded<T>(work: Promise<T>, extraMs = 0, connection: DeadlineConnection | null = this.connection): Promise<T> {
    if (this.deadlineMs === undefined) return work;
    const ms = this.deadlineMs + extraMs;
    return withinDeadline(work, ms, `no answer within ${ms} ms (the client sets no commandTimeout of its own)`, connection ?? undefined);
  }

  /** Runs a command (bounded), and names what failed. */
  private async run<T>(command: () => Promise<T>, extraMs = 0): Promise<T> {
    if (this.client.status === 'wait' || this.connecting !== undefined) await this.firstConnection();
    try {
      return await this.bounded(command(), extraMs);
    } catch (error) {
      const message = (error as Error).message;
      // A key of another type (a hash, a list): the app's, not ours.
      if (/\bWRONGTYPE\b/.test(message)) {
        throw new IdempotencyNotARecordError(`The key holds no idempotency record: ${message}`, { cause: error });
      }
      // SET with both NX and GET arrived in Redis 7.0.
      const hint = /syntax error/i.test(message) ? ' (this store needs Redis 7.0 or later)' : '';
      throw new IdempotencyStoreError(`Redis command failed: ${message}${hint}`, { cause: error });
    }
  }

  private decode(value: string): DecodedRecord {
    try {
      return decodeRecord(value);
    } catch (error) {
      throw new IdempotencyNotARecordError(`The key holds no idempotency record: ${(error as Error).message}`, { cause: error });
    }
  }
}

/**
 * The lease left of the record a claim found, within [1, leaseMs]: the PTTL Redis read for a
 * waiting claim (a waiter sleeps by it), else from the holder's clock (only a 409's hint).
 */
function leaseLeft(record: DecodedRecord, pttlMs: number | undefined, leaseMs: number): number {
  const left = pttlMs ?? (record.state === 'processing' ? record.leaseEndMs - Date.now() : 1);
  return Math.min(Math.max(left, 1), leaseMs);
}

/** What a claim that found `held` answers; `retryAfterMs` is the lease left, if in progress. */
function claimResultOf(held: DecodedRecord, fingerprint: string, retryAfterMs: number): ClaimResult {
  if (fingerprint !== '' && held.fingerprint !== '' && held.fingerprint !== fingerprint) return { status: 'mismatch' };
  if (held.state === 'completed') return { status: 'completed', response: held.response };
  return { status: 'in_progress', retryAfterMs };
}

/**
 * A bound for each command when the client sets none, so that an outage turns into the route's
 * outage policy instead of a hanging request: the module's own client, and one the app hands in
 * made with ioredis's defaults (no `commandTimeout`; an offline queue that holds commands while Redis is away, and
 * 20 retries each). A `commandTimeout` of the client's own also bounds its offline queue, and is
 * kept; a Cluster's offline queue is bounded by nothing but its absence.
 */
function ownDeadlineMs(client: Redis | Cluster): number | undefined {
  if (isCluster(client)) {
    const { enableOfflineQueue, redisOptions } = client.options;
    return enableOfflineQueue === false && typeof redisOptions?.commandTimeout === 'number' ? undefined : DEFAULTS.redisCommandTimeoutMs;
  }
  return typeof client.options.commandTimeout === 'number' ? undefined : DEFAULTS.redisCommandTimeoutMs;
}

/** `instanceof Cluster` without loading ioredis (a type-only import keeps it an optional peer). */
function isCluster(client: Redis | Cluster): client is Cluster {
  return client.isCluster;
}
