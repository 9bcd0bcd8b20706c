import { afterAll, beforeAll, beforeEach, describe, expect, it } from '@jest/globals';
import type { Redis } from 'ioredis';
import { randomUUID } from 'node:crypto';
import {
  EVERY_APP,
  createRealApp,
  outcome,
  send,
  sendPastInProgress,
  start,
  until,
  type AdapterName,
  type RealApp,
  type SendOptions,
} from './support/real-app.js';
import { startRedisServer, type RedisServer } from './support/redis-server.js';
import { connectRedis } from './support/services.js';

const openConnections = (real: RealApp) =>
  new Promise<number>((resolve, reject) =>
    real.app.getHttpServer().getConnections((error: Error | null, count: number) => (error ? reject(error) : resolve(count))),
  );

describe.each(EVERY_APP)('a real app under an outer timeout and clients that leave (%s, %s store)', (adapter, store) => {
  let real: RealApp;
  let options: SendOptions;
  const post = (path: string) => send(real.url, `/api/v1/users${path}`, options);

  beforeAll(async () => {
    real = await createRealApp({ adapter, store, timeoutMs: 300 });
  });
  afterAll(async () => real?.close());
  beforeEach(() => {
    real.probe.reset();
    options = { as: 'alice', key: randomUUID(), body: { report: 'monthly' } };
  });

  it('runs the handler once across an outer timeout: 408, then 409 IN_PROGRESS while it runs, then 409 NOT_REPLAYABLE', async () => {
    real.probe.hold();
    const first = await post('/slow'); // the TimeoutInterceptor answers after 300 ms; the handler is still held
    const second = await post('/slow');
    real.probe.release();
    await until(() => real.probe.finished('slow') === real.probe.runs('slow'), 3000, 'the held runs finishing');
    const third = await sendPastInProgress(real.url, '/api/v1/users/slow', options);
    expect({
      first: outcome(first),
      second: outcome(second),
      third: outcome(third),
      runs: real.probe.runs('slow'),
    }).toEqual({
      first: '408 REQUEST_TIMEOUT',
      second: '409 IDEMPOTENCY_IN_PROGRESS',
      third: '409 IDEMPOTENCY_RESPONSE_NOT_REPLAYABLE',
      runs: 1,
    });
  });

  it('never runs the handler again after its client went away mid-run: the retry replays or is not replayable', async () => {
    const before = await openConnections(real);
    real.probe.hold();
    const { answer, abort } = start(real.url, '/api/v1/users/invitations', options);
    const gone = answer.then(
      () => 'answered',
      () => 'aborted',
    );
    await until(() => real.probe.runs('invite') === 1, 3000, 'the handler starting');
    abort();
    await until(async () => (await openConnections(real)) <= before, 3000, 'the server seeing the client go');
    real.probe.release();
    await until(() => real.probe.finished('invite') === 1, 3000, 'the handler finishing');
    const retry = await sendPastInProgress(real.url, '/api/v1/users/invitations', options);
    expect(await gone).toBe('aborted');
    expect(['201 replayed', '409 IDEMPOTENCY_RESPONSE_NOT_REPLAYABLE']).toContain(outcome(retry));
    expect(real.probe.runs('invite')).toBe(1);
  });
});

describe.each<AdapterName>(['express', 'fastify'])('a real app on a Redis that pauses (%s)', (adapter) => {
  // Six times the module's 1 s bound: an answer at the bound must come within the pause on a
  // loaded CI machine too (a helper freezing the process for 0-2.5 s at a time overran 2.5 s).
  const PAUSE_MS = 6000;
  let server: RedisServer;
  let admin: Redis;
  let real: RealApp;
  let options: SendOptions;
  const post = () => send(real.url, '/api/v1/users/invitations', options);
  const pause = () => admin.call('CLIENT', 'PAUSE', String(PAUSE_MS), 'ALL');
  /** Redis answers again (the admin connection is paused too: a PING returns once the pause is over). */
  const pauseOver = () =>
    until(
      async () => {
        try {
          return (await admin.ping()) === 'PONG';
        } catch {
          return false;
        }
      },
      PAUSE_MS + 3000,
      'the pause ending',
    );

  beforeAll(async () => {
    server = await startRedisServer();
    admin = await connectRedis(server.url);
    // The outer timeout is longer than the pause here: this is about the store, not the timeout.
    real = await createRealApp({ adapter, store: 'redis', redisUrl: server.url, timeoutMs: 10_000 });
  });
  afterAll(async () => {
    await real?.close();
    admin?.disconnect();
    await server?.kill();
  });
  beforeEach(() => {
    real.probe.reset();
    options = { as: 'alice', key: randomUUID(), body: { email: 'paused@example.com' } };
  });

  it('fails open while Redis is paused, and leaves no key in processing: a retry after the pause replays', async () => {
    const pausedAt = Date.now();
    await pause();
    const first = await post();
    const answeredWithinPause = Date.now() - pausedAt < PAUSE_MS;
    await pauseOver();
    const retry = await sendPastInProgress(real.url, '/api/v1/users/invitations', options, 1500);
    expect({
      first: outcome(first),
      answeredWithinPause,
      retry: outcome(retry),
      runs: real.probe.runs('invite'),
    }).toEqual({ first: '201', answeredWithinPause: true, retry: '201 replayed', runs: 1 });
  });

  it('answers when Redis pauses while the handler runs (the save times out), and a retry after the pause replays', async () => {
    real.probe.hold();
    const pending = start(real.url, '/api/v1/users/invitations', options).answer;
    await until(() => real.probe.runs('invite') === 1, 3000, 'the handler starting');
    const pausedAt = Date.now();
    await pause();
    real.probe.release();
    const first = await pending;
    const answeredWithinPause = Date.now() - pausedAt < PAUSE_MS;
    await pauseOver();
    const retry = await sendPastInProgress(real.url, '/api/v1/users/invitations', options, 1500);
    expect({
      first: outcome(first),
      answeredWithinPause,
      retry: outcome(retry),
      runs: real.probe.runs('invite'),
    }).toEqual({ first: '201', answeredWithinPause: true, retry: '201 replayed', runs: 1 });
  });

  it('saves the answer once Redis takes connections again when the save failed outright, instead of leaving the key in progress', async () => {
    real.probe.hold();
    const pending = start(real.url, '/api/v1/users/invitations', options).answer;
    await until(() => real.probe.runs('invite') === 1, 3000, 'the handler starting');
    // The app loses its connection and cannot make a new one (its client has no password), so
    // the save fails at once: it never reaches Redis, unlike a save that timed out.
    await admin.call('CONFIG', 'SET', 'requirepass', 'locked');
    await admin.call('CLIENT', 'KILL', 'TYPE', 'normal', 'SKIPME', 'yes');
    real.probe.release();
    const first = await pending;
    await admin.call('CONFIG', 'SET', 'requirepass', '');
    // Completed, not left in progress for the lease (a retry before then would be refused, and
    // after it would run the handler again). Records start with their state: C completed.
    const record = real.storageKey('alice', 'invite', options.key!);
    await until(async () => (await admin.get(record))?.startsWith('C') ?? false, 5000, 'the answer saved');
    const retry = await send(real.url, '/api/v1/users/invitations', options);
    expect({ first: outcome(first), retry: outcome(retry), runs: real.probe.runs('invite') }).toEqual({
      first: '201',
      retry: '201 replayed',
      runs: 1,
    });
  });
});
