import { Logger } from '@nestjs/common';
import type { Redis, RedisOptions } from 'ioredis';
import { randomUUID } from 'node:crypto';
import { IdempotencyConfigError } from '../../errors/idempotency.errors.js';
import { coalesceWrites } from '../redis/coalesce-writes.js';
import { decodeRecord } from '../redis/redis-record.js';
import type { RecordTracking, TrackedRecord, TrackingListener } from './record-tracking.js';

/** Where Redis publishes invalidations to a RESP2 redirect connection. */
const INVALIDATE_CHANNEL = '__redis__:invalidate';
const INVALIDATE_CHANNEL_BYTES = Buffer.from(INVALIDATE_CHANNEL);

/**
 * A forget's notice to every cache (`<subscriber id>:<nonce>`), and where each answers it: the
 * forgetter's own channel. Pub/Sub channels are server-wide (no db, no `keyPrefix`): caches of
 * other services on the server answer too, which only adds to the count awaited.
 */
const FORGET_CHANNEL = '__idempotency__:forget';
const FORGET_CHANNEL_BYTES = Buffer.from(FORGET_CHANNEL);
const HEARD_CHANNEL = '__idempotency__:heard:';
/** The longest a forget waits for the other caches to have heard it, in milliseconds. */
export const FORGET_HEARD_MS = 2000;

/** A forget waiting for the caches' answers: `expected` is known once the notice's PUBLISH answers. */
interface Heard {
  count: number;
  expected: number;
  done: () => void;
}

/** How often both connections are checked, and how long each check, and each command turning tracking on, may take, in milliseconds. */
export const TRACKING_CHECK_MS = 1000;

/**
 * Redis server-assisted client-side caching for the local cache, on a single primary. The cache
 * owns two connections, duplicated from the store's client (same server, credentials, db and
 * `keyPrefix`), and never changes the store's client itself: a client the user hands in may be
 * shared, by the app or by another module's cache, and tracking is a connection's state.
 *
 * - The reader runs `CLIENT TRACKING ON REDIRECT <id>` and the tracked reads (it reads nothing
 *   else, so every key it reads is one to track, without `OPTIN` and a `CLIENT CACHING YES`
 *   before each): Redis remembers each key it read, and on any change of it (a write, a delete,
 *   an expiry, a flush, from any connection) sends an invalidation to the redirect connection.
 * - The subscriber, in RESP2, subscribed to `__redis__:invalidate`: each message is the array of
 *   keys (read as buffers: a key may hold a comma), or null for a flush; anything else (a
 *   client's own PUBLISH there) empties the cache.
 *
 * A forget must not return while another instance can still answer from what it forgot: after
 * the delete, `heardEverywhere` publishes a notice to every cache's subscriber and waits for each
 * to answer it. Redis writes a connection's messages in order, so a subscriber reads the notice
 * after the invalidation the delete sent it, and has dropped the entry when it answers.
 *
 * Tracking lives with the connections. When either closes, the listener is reset and `live` turns
 * false until both are back and tracking is on again; when the store's connection closes (another
 * server may be behind its address now), the cache's two reconnect with it. Every second both
 * are checked (`CLIENT TRACKINGINFO` on the reader, a `PING` of the subscriber): a connection
 * that went silent, or a redirect Redis lost, also resets; a silent one is reconnected.
 */
export class RedisRecordTracking implements RecordTracking {
  private readonly logger = new Logger('IdempotencyLocalCache');
  private readonly keyPrefix: string;
  private listener: TrackingListener | undefined;
  /** The cache's own connections: the tracked reads, and the invalidations. */
  private reader: Redis | undefined;
  private subscriber: Redis | undefined;
  /** The subscriber's client id, once it is subscribed on its current connection. */
  private subscriberId: number | undefined;
  /** Bumped whenever tracking is lost, so that an enabling begun before it does not turn live. */
  private epoch = 0;
  private enabling: Promise<void> | undefined;
  private stopped = false;
  private timer: NodeJS.Timeout | undefined;
  /** Whether the cache's being off was said since tracking was last live (one warning per outage). */
  private warned = false;
  /** Forgets waiting for the caches' answers, by nonce. */
  private readonly heard = new Map<string, Heard>();
  /** Forgets waiting for tracking to be live again (see `heardEverywhere`). */
  private readonly liveWaiters = new Set<() => void>();
  live = false;

  constructor(private readonly client: Redis) {
    // Invalidations name keys as Redis holds them; the cache knows them without the client's prefix.
    this.keyPrefix = client.options.keyPrefix ?? '';
    // Sent as U+FFFD, a lone surrogate never matched the invalidations' key names: stale replays.
    if (/\p{Cs}/u.test(this.keyPrefix)) {
      throw new IdempotencyConfigError(
        `localCache: the Redis client's keyPrefix ${JSON.stringify(this.keyPrefix)} holds a lone surrogate, which Redis keeps as U+FFFD: ` +
          'the cache could not tell which of its records another instance forgot. Use well-formed text.',
      );
    }
  }

  async start(listener: TrackingListener): Promise<void> {
    this.listener = listener;
    // No offline queue, no resend: a read or a tracking command never reaches a later connection.
    const reader = this.own({ enableOfflineQueue: false });
    // A tracked read follows each replay the store answered (a storm brings many in one turn): its
    // writes go out with the turn's others, one syscall, as on the store's own connection (a
    // write each measured ~5 µs).
    coalesceWrites(reader);
    // RESP2 (`replyMapping: 'resp3'`, ioredis 6, is refused there: its default mapping instead).
    const subscriber = this.own({ protocol: 2, replyMapping: undefined, keyPrefix: '', enableOfflineQueue: true, autoResubscribe: false } as RedisOptions);
    this.reader = reader;
    this.subscriber = subscriber;
    reader.on('close', this.lost);
    reader.on('ready', this.enable);
    subscriber.on('messageBuffer', this.onMessage);
    subscriber.on('close', this.onSubscriberClose);
    subscriber.on('ready', this.enable);
    this.client.on('close', this.onStoreClose);
    this.client.on('select', this.onStoreSelect);
    this.timer = setInterval(() => void this.check(), TRACKING_CHECK_MS).unref();
    await Promise.all([reader, subscriber].map((connection) => connection.status === 'ready' || waitReady(connection, TRACKING_CHECK_MS)));
    await this.enable();
    if (!this.live) this.warnOnce('Redis tracking is not on yet: the local cache stays empty until it is');
  }

  /** One round trip on the reader, whose every read Redis tracks: the record and its `PTTL`, in one pipeline. */
  async read(key: string): Promise<TrackedRecord | undefined> {
    if (!this.reader) return undefined;
    const replies = (await this.reader.pipeline().get(key).pttl(key).exec()) ?? [];
    for (const [error] of replies) if (error) throw error;
    const value = replies[0]?.[1] as string | null;
    // A client with `stringNumbers` reads the PTTL as a string.
    const ttlMs = Number(replies[1]?.[1]);
    // A record without an expiry (-1) is not cached: nothing may outlive a retention it lacks.
    if (!value || !(ttlMs > 0)) return undefined;
    try {
      const record = decodeRecord(value);
      return record.state === 'completed' ? { fingerprint: record.fingerprint, response: record.response, ttlMs } : undefined;
    } catch {
      return undefined;
    }
  }

  /**
   * Waits until every cache on the server heard a forget (at most `FORGET_HEARD_MS`). A forgetter
   * whose own tracking is down (its connections cut, reconnecting) can hear no answer: it waits
   * for its tracking to come back, then tells the others, within the same bound. It returned at
   * once, and another instance behind a slow link replayed the forgotten answer after the forget
   * had returned (an adversarial helper: 10 of 10).
   */
  async heardEverywhere(): Promise<void> {
    const until = performance.now() + FORGET_HEARD_MS;
    for (;;) {
      const told = await this.tellEveryCache(until);
      if (told !== 'untold' || this.stopped) return;
      // The reader's close not read yet (still live): its close comes first, then the wait.
      if (this.live) await new Promise((resolve) => setImmediate(resolve));
      if (performance.now() >= until) {
        this.logger.warn(`could not tell the other instances' local caches of a forget within ${FORGET_HEARD_MS} ms: until they hear its invalidation, they may replay the forgotten answer`);
        return;
      }
      if (!(await this.liveAgain(until))) {
        if (this.stopped) return;
        this.logger.warn(
          `the local cache's Redis tracking was not back within ${FORGET_HEARD_MS} ms of a forget, so the other instances could not be asked: ` +
            'until they hear its invalidation, they may replay the forgotten answer',
        );
        return;
      }
    }
  }

  /** Publishes a forget's notice and waits for every cache's answer until `until`; 'untold' when it could not publish. */
  private async tellEveryCache(until: number): Promise<'heard' | 'unheard' | 'untold'> {
    const { reader, subscriberId } = this;
    if (!this.live || !reader || subscriberId === undefined) return 'untold';
    const nonce = randomUUID();
    let timer: NodeJS.Timeout | undefined;
    const heard: Heard = { count: 0, expected: Infinity, done: () => undefined };
    const settled = new Promise<void>((resolve) => {
      heard.done = resolve;
      timer = setTimeout(resolve, Math.max(0, until - performance.now())).unref();
    });
    // Answers may be read before the notice's own reply: counted from the start.
    this.heard.set(nonce, heard);
    try {
      // The caches are the channel's own subscribers: a pattern subscriber (a `PSUBSCRIBE *` left
      // open by someone debugging) hears the notice and never answers, and counted by PUBLISH, it
      // made every forget wait out its bound (an adversarial helper). Counted in one transaction.
      const published = reader
        .multi()
        .pubsub('NUMSUB', FORGET_CHANNEL)
        .publish(FORGET_CHANNEL, `${subscriberId}:${nonce}`)
        .exec()
        .then((replies) => {
          const [numsub, publish] = replies ?? [];
          if (numsub?.[0] || publish?.[0]) throw numsub?.[0] ?? publish?.[0];
          heard.expected = Number((numsub?.[1] as unknown[] | undefined)?.[1]);
          if (!(heard.expected >= 0)) throw new Error(`PUBSUB NUMSUB answered ${JSON.stringify(numsub?.[1])}`);
          if (heard.count >= heard.expected) heard.done();
        });
      await Promise.race([published, settled]);
      await settled;
    } catch (error) {
      // The reader was cut just now (its close not read yet): told once tracking is back.
      if (reader.status !== 'ready' || !this.live) return 'untold';
      this.logger.warn(`could not tell the other instances' local caches of a forget: ${(error as Error).message}`);
      return 'unheard';
    } finally {
      clearTimeout(timer);
      this.heard.delete(nonce);
    }
    if (heard.count < heard.expected) {
      const missing = heard.expected === Infinity ? 'the caches' : `${heard.expected - heard.count} of ${heard.expected} local caches`;
      this.logger.warn(`${missing} did not confirm a forget within ${FORGET_HEARD_MS} ms: until they hear it, they may replay the forgotten answer`);
      return 'unheard';
    }
    return 'heard';
  }

  /** Whether tracking is live again before `until` (false once the cache stops). */
  private liveAgain(until: number): Promise<boolean> {
    if (this.live) return Promise.resolve(true);
    return new Promise((resolve) => {
      const done = (live: boolean) => {
        clearTimeout(timer);
        this.liveWaiters.delete(onLive);
        resolve(live);
      };
      const onLive = () => done(!this.stopped && this.live);
      const timer = setTimeout(() => done(false), Math.max(0, until - performance.now())).unref();
      this.liveWaiters.add(onLive);
      void this.enable();
    });
  }

  async stop(): Promise<void> {
    this.stopped = true;
    for (const heard of this.heard.values()) heard.done();
    for (const onLive of [...this.liveWaiters]) onLive();
    clearInterval(this.timer);
    this.lost();
    this.client.off('close', this.onStoreClose);
    this.client.off('select', this.onStoreSelect);
    await Promise.all([this.reader, this.subscriber].map((connection) => connection && close(connection)));
  }

  /**
   * A connection of the cache's own, duplicated from the store's client, on the db that client
   * reads now: `SELECT` changes the db ioredis keeps for the connection, not its options.
   */
  private own(options: RedisOptions): Redis {
    const connection = this.client.duplicate({
      db: selectedDb(this.client),
      ...options,
      lazyConnect: false,
      autoResendUnfulfilledCommands: false,
      himportFieldsets: undefined,
    } as RedisOptions);
    connection.on('error', () => undefined);
    return connection;
  }

  private readonly onMessage = (channel: Buffer, keys: unknown): void => {
    if (FORGET_CHANNEL_BYTES.equals(channel)) return this.answerForget(keys);
    if (!INVALIDATE_CHANNEL_BYTES.equals(channel)) return this.countHeard(keys);
    // Redis sends the keys as an array, or null for FLUSHALL / FLUSHDB. Anything else was
    // published there by a client: not knowing what changed, the cache starts afresh.
    if (!Array.isArray(keys)) {
      this.listener?.reset();
      return;
    }
    const prefix = this.keyPrefix;
    const names = keys.map(String);
    this.listener?.invalidated(prefix ? names.filter((name) => name.startsWith(prefix)).map((name) => name.slice(prefix.length)) : names);
  };

  /**
   * A forget's notice: every invalidation sent before it was read already (one connection, in
   * order), so this cache no longer holds the record; it answers on its reader. A reader that is
   * not connected answers nothing: the forget waits out its bound.
   */
  private answerForget(message: unknown): void {
    const match = /^(\d{1,20}):([\w-]{1,64})$/.exec(String(message));
    if (!match || this.reader?.status !== 'ready') return;
    this.reader.publish(`${HEARD_CHANNEL}${match[1]}`, match[2]).catch(() => undefined);
  }

  /** An answer to one of this instance's forgets (its own channel is the only other it subscribes to). */
  private countHeard(message: unknown): void {
    const heard = this.heard.get(String(message));
    if (heard && ++heard.count >= heard.expected) heard.done();
  }

  private readonly lost = (): void => {
    this.epoch++;
    this.live = false;
    this.listener?.reset();
  };

  private readonly onSubscriberClose = (): void => {
    this.subscriberId = undefined;
    this.lost();
  };

  /**
   * The store's connection dropped: its address may lead to another server now (a failover).
   * The cache starts afresh, and its connections reconnect too, so that all three reach one
   * server. Only connected ones: while Redis is down they are reconnecting already.
   */
  private readonly onStoreClose = (): void => {
    this.lost();
    for (const connection of [this.reader, this.subscriber]) if (connection?.status === 'ready') connection.disconnect(true);
  };

  /**
   * The store's client switched to another db (`SELECT`): what the cache holds is the old db's,
   * and its reader follows the store. A read on its way is discarded; should the reader miss the
   * switch (it is reconnecting), the cache keeps only what matches the store's answer anyway.
   */
  private readonly onStoreSelect = (db: number): void => {
    this.listener?.reset();
    this.reader?.select(db).catch(() => this.reader?.disconnect(true));
  };

  /** Turns tracking on when both connections are ready and it is off; resolves when that try ends. */
  private readonly enable = (): Promise<void> => {
    const { reader, subscriber } = this;
    if (this.enabling) return this.enabling;
    if (this.stopped || this.live || !reader || !subscriber || reader.status !== 'ready' || subscriber.status !== 'ready') {
      return Promise.resolve();
    }
    this.enabling = this.turnOn(reader, subscriber).finally(() => {
      this.enabling = undefined;
    });
    return this.enabling;
  };

  /** Subscribes (once per subscriber connection), then turns the reader's tracking on towards it. */
  private async turnOn(reader: Redis, subscriber: Redis): Promise<void> {
    const epoch = this.epoch;
    try {
      if (this.subscriberId === undefined) {
        // A number, also on a client with `stringNumbers` (the redirect is compared with it).
        const id = Number(await answerOf(subscriber, subscriber.client('ID')));
        await answerOf(subscriber, subscriber.subscribe(INVALIDATE_CHANNEL, FORGET_CHANNEL, `${HEARD_CHANNEL}${id}`));
        this.subscriberId = id;
      }
      await answerOf(reader, reader.client('TRACKING', 'OFF'));
      await answerOf(reader, reader.client('TRACKING', 'ON', 'REDIRECT', String(this.subscriberId)));
      // A connection that dropped meanwhile took the tracking with it: the next check enables again.
      if (epoch === this.epoch && !this.stopped) {
        this.live = true;
        this.warned = false;
        for (const onLive of [...this.liveWaiters]) onLive();
      }
    } catch (error) {
      this.warnOnce(`could not turn Redis tracking on (the local cache stays empty meanwhile): ${(error as Error).message}`);
    }
  }

  /** Turns tracking on if it is off; else checks that both connections answer and the redirect holds. */
  private async check(): Promise<void> {
    const { reader, subscriber } = this;
    if (this.stopped || !reader || !subscriber) return;
    if (!this.live) return this.enable();
    const epoch = this.epoch;
    const [info, pong] = await Promise.all([
      within(reader.client('TRACKINGINFO'), TRACKING_CHECK_MS),
      within(subscriber.ping(), TRACKING_CHECK_MS),
    ]);
    if (epoch !== this.epoch || this.stopped) return;
    if (info === undefined || pong === undefined) {
      this.warnOnce('a Redis connection of the local cache did not answer: the local cache starts afresh');
      this.lost();
      if (info === undefined) reader.disconnect(true);
      if (pong === undefined) subscriber.disconnect(true);
    } else if (!redirectsTo(info, this.subscriberId)) {
      this.warnOnce('Redis tracking was lost (no redirect): the local cache starts afresh');
      this.lost();
    }
  }

  private warnOnce(message: string): void {
    if (this.warned) return;
    this.warned = true;
    this.logger.warn(message);
  }
}

/** Whether a `CLIENT TRACKINGINFO` reply says tracking is on, redirected to `id`, and not broken. */
function redirectsTo(info: unknown, id: number | undefined): boolean {
  // A flat array (RESP2, and ioredis's default mapping of RESP3), or a map (`replyMapping: 'resp3'`).
  const field = (name: string): unknown =>
    Array.isArray(info) ? info[info.indexOf(name) + 1] : info instanceof Map ? info.get(name) : (info as Record<string, unknown> | undefined)?.[name];
  const flags = field('flags');
  return Array.isArray(flags) && flags.includes('on') && !flags.includes('broken_redirect') && Number(field('redirect')) === id;
}

/**
 * The answer to `command`, sent on `connection`; past `TRACKING_CHECK_MS` an error, and the
 * connection reconnects. The cache's connections resend nothing, and ioredis never settles a
 * command that was in flight on a connection that dropped (unless `maxRetriesPerRequest` is 0),
 * nor one whose connection went silent: a try to turn tracking on must not wait for it for ever,
 * as the next try waits for this one.
 */
function answerOf<T>(connection: Redis, command: Promise<T>): Promise<T> {
  let timer: NodeJS.Timeout | undefined;
  const late = new Promise<never>((_resolve, reject) => {
    timer = setTimeout(() => {
      connection.disconnect(true);
      reject(new Error(`no answer within ${TRACKING_CHECK_MS} ms`));
    }, TRACKING_CHECK_MS).unref();
  });
  return Promise.race([command, late]).finally(() => clearTimeout(timer));
}

/** The promise's value, or undefined when it rejects or takes longer than `ms`. */
function within<T>(promise: Promise<T>, ms: number): Promise<T | undefined> {
  let timer: NodeJS.Timeout | undefined;
  const late = new Promise<undefined>((resolve) => {
    timer = setTimeout(resolve, ms, undefined).unref();
  });
  return Promise.race([promise.catch(() => undefined), late]).finally(() => clearTimeout(timer));
}

/** Quits `connection` (at most `TRACKING_CHECK_MS` when Redis is silent), or drops it when it is not connected. */
async function close(connection: Redis): Promise<void> {
  if (connection.status === 'ready' && (await within(connection.quit(), TRACKING_CHECK_MS)) !== undefined) return;
  connection.disconnect();
}

function waitReady(connection: Redis, ms: number): Promise<void> {
  return new Promise((resolve) => {
    const timer = setTimeout(done, ms).unref();
    connection.once('ready', done);
    function done() {
      clearTimeout(timer);
      connection.off('ready', done);
      resolve();
    }
  });
}

/** The db a client reads now: the last `SELECT` ioredis made on it (kept across reconnects), or its `db` option. */
function selectedDb(client: Redis): number | undefined {
  return (client as unknown as { condition?: { select?: number } }).condition?.select ?? client.options.db;
}
