// The local cache's replays: what a replay answered by the local cache carries, against one answered by Redis:
// the same status, headers and body bytes (text, binary), the same refusals (422, 409 not
// replayable), saved refusals (saveStatuses), waits (waitForResultMs), counters and events.
import { afterAll, beforeAll, describe, expect, it } from '@jest/globals';
import { Body, Controller, HttpCode, NotFoundException, Post, Res, type INestApplication } from '@nestjs/common';
import { randomUUID } from 'node:crypto';
import { request as httpRequest, type IncomingHttpHeaders } from 'node:http';
import {
  IdempotencyAdmin,
  IdempotencyCounters,
  IdempotencyStore,
  LocalCacheIdempotencyStore,
  NoRepeatSubmit,
  RedisIdempotencyStore,
  type IdempotencyEvent,
  type IdempotencyModuleOptions,
} from 'nestjs-idempotency';
import { eventually } from './support/eventually.js';
import { REDIS_URL } from './support/services.js';
import { makeApp } from './support/edge-app.js';

const runs = new Map<string, number>();
const bump = (k: string) => {
  const run = (runs.get(k) ?? 0) + 1;
  runs.set(k, run);
  return run;
};

/** Bytes that are not UTF-8 and hold a NUL: saved as base64. */
const BINARY = Buffer.from([0x00, 0xff, 0xfe, 0x80, 0x41, 0x0a, 0xc3, 0x28, 0x00, 0x7f]);

@Controller('ans')
class AnswersController {
  @Post('json')
  @NoRepeatSubmit({ expireSeconds: 600 })
  json(@Body() body: { k: string; text?: string }, @Res({ passthrough: true }) res: { header?: (n: string, v: string) => void; setHeader?: (n: string, v: string) => void }) {
    const run = bump(body.k);
    (res.header ?? res.setHeader)!.call(res, 'etag', `"e-${run}"`);
    (res.header ?? res.setHeader)!.call(res, 'location', `/ans/${encodeURIComponent(body.k)}/${run}`);
    return { k: body.k, run, text: body.text ?? 'naïve café ☕ 𝄞 日本語' };
  }

  @Post('binary')
  @NoRepeatSubmit({ expireSeconds: 600 })
  binary(@Body() body: { k: string }, @Res() res: { raw?: unknown; status: (n: number) => unknown } & Record<string, unknown>) {
    bump(body.k);
    const raw = (res.raw ?? res) as import('node:http').ServerResponse;
    raw.statusCode = 200;
    raw.setHeader('content-type', 'application/octet-stream');
    raw.end(BINARY);
  }

  @Post('big')
  @NoRepeatSubmit({ expireSeconds: 600, maxResponseBytes: 100 })
  big(@Body() body: { k: string }) {
    return { k: body.k, run: bump(body.k), pad: 'x'.repeat(500) };
  }

  @Post('slow')
  @NoRepeatSubmit({ expireSeconds: 600, waitForResultMs: 5000 })
  async slow(@Body() body: { k: string; ms?: number }) {
    await new Promise((resolve) => setTimeout(resolve, body.ms ?? 400));
    return { k: body.k, run: bump(body.k) };
  }

  @Post('missing')
  @HttpCode(201)
  @NoRepeatSubmit({ expireSeconds: 600, saveStatuses: [404] })
  missing(@Body() body: { k: string }) {
    throw new NotFoundException({ code: 'NOPE', k: body.k, run: bump(body.k) });
  }
}

interface Instance {
  app: INestApplication;
  url: string;
  admin: IdempotencyAdmin;
  store: IdempotencyStore;
  events: IdempotencyEvent[];
}

async function start(adapter: 'express' | 'fastify', options: IdempotencyModuleOptions): Promise<Instance> {
  const events: IdempotencyEvent[] = [];
  const { app, url } = await makeApp(adapter, [AnswersController], { ...options, onEvent: (event) => void events.push(event) });
  return { app, url, admin: app.get(IdempotencyAdmin), store: app.get(IdempotencyStore), events };
}

interface Raw {
  status: number;
  headers: IncomingHttpHeaders;
  body: Buffer;
}

function send(instance: Instance, path: string, k: string, extra: Record<string, unknown> = {}, abortAfterMs?: number): Promise<Raw> {
  return new Promise((resolve, reject) => {
    const payload = JSON.stringify({ k, ...extra });
    const req = httpRequest(
      `${instance.url}/ans/${path}`,
      { method: 'POST', agent: false, headers: { 'content-type': 'application/json', 'idempotency-key': k, 'content-length': Buffer.byteLength(payload) } },
      (res) => {
        const chunks: Buffer[] = [];
        res.on('data', (chunk: Buffer) => chunks.push(chunk));
        res.on('end', () => resolve({ status: res.statusCode!, headers: res.headers, body: Buffer.concat(chunks) }));
      },
    );
    req.on('error', reject);
    if (abortAfterMs !== undefined) setTimeout(() => req.destroy(new Error('aborted by the test')), abortAfterMs);
    req.end(payload);
  });
}

const holds = (instance: Instance, storageKey: string) =>
  (instance.store as unknown as { records: { entries: Map<string, unknown> } }).records.entries.has(storageKey);
const storageKeyOf = (instance: Instance, handler: string, k: string) =>
  instance.admin.storageKeyOf({ user: { anonymous: true }, handler: `AnswersController.${handler}`, key: k });

/** What a client can compare between two replays: all but the connection's own headers. */
const comparable = ({ status, headers, body }: Raw) => {
  const { date, connection, 'keep-alive': _keepAlive, ...rest } = headers;
  return { status, headers: rest, body: body.toString('base64') };
};

describe.each(['express', 'fastify'] as const)('localCache replays as Redis does (%s)', (adapter) => {
  const keyPrefix = `rvan${randomUUID().slice(0, 8)}`;
  let cached: Instance;
  let plain: Instance;

  beforeAll(async () => {
    cached = await start(adapter, { store: { redis: REDIS_URL }, keyPrefix, localCache: true });
    plain = await start(adapter, { store: { redis: REDIS_URL }, keyPrefix });
    expect(cached.store).toBeInstanceOf(LocalCacheIdempotencyStore);
    expect(plain.store).toBeInstanceOf(RedisIdempotencyStore);
  });
  afterAll(async () => {
    await Promise.all([cached?.app.close(), plain?.app.close()]);
  });

  /** First call on the cached instance; a replay from Redis on each (the cached one's fills its cache); one from the cache. */
  async function both(path: string, k: string, extra: Record<string, unknown> = {}): Promise<{ first: Raw; fromRedis: Raw; fromCache: Raw }> {
    const first = await send(cached, path, k, extra);
    const fromRedis = await send(plain, path, k, extra);
    expect(holds(cached, storageKeyOf(cached, path, k))).toBe(false);
    expect(comparable(await send(cached, path, k, extra))).toEqual(comparable(fromRedis));
    await eventually(() => holds(cached, storageKeyOf(cached, path, k)), { timeoutMs: 3000, describe: () => `${path} never cached` });
    const fromCache = await send(cached, path, k, extra);
    return { first, fromRedis, fromCache };
  }

  it('JSON with non-ASCII text, etag and location: the same status, headers and bytes', async () => {
    const k = `json-${randomUUID()}`;
    const { first, fromRedis, fromCache } = await both('json', k);
    expect(first.status).toBe(201);
    expect(fromRedis.headers['idempotent-replayed']).toBe('true');
    expect(comparable(fromCache)).toEqual(comparable(fromRedis));
    expect(fromCache.body.equals(first.body)).toBe(true);
    expect(runs.get(k)).toBe(1);
  });

  it('binary bytes (base64 in the record): the same bytes', async () => {
    const k = `bin-${randomUUID()}`;
    const { first, fromRedis, fromCache } = await both('binary', k);
    expect(first.body.equals(BINARY)).toBe(true);
    expect(comparable(fromCache)).toEqual(comparable(fromRedis));
    expect(fromCache.body.equals(BINARY)).toBe(true);
  });

  it('another payload under a cached key is 422, as from Redis', async () => {
    const k = `fp-${randomUUID()}`;
    await both('json', k);
    const fromRedis = await send(plain, 'json', k, { text: 'other' });
    const fromCache = await send(cached, 'json', k, { text: 'other' });
    expect(fromRedis.status).toBe(422);
    expect(comparable(fromCache)).toEqual(comparable(fromRedis));
  });

  it('too large to keep: 409 IDEMPOTENCY_RESPONSE_NOT_REPLAYABLE from the cache too, the handler ran once', async () => {
    const k = `big-${randomUUID()}`;
    const { first, fromRedis, fromCache } = await both('big', k);
    expect(first.status).toBe(201);
    expect(fromRedis.status).toBe(409);
    expect(JSON.parse(fromRedis.body.toString())).toMatchObject({ code: 'IDEMPOTENCY_RESPONSE_NOT_REPLAYABLE' });
    expect(comparable(fromCache)).toEqual(comparable(fromRedis));
    expect(runs.get(k)).toBe(1);
  });

  it('not delivered (a record saved by the store with unreplayable: not_delivered): 409 from the cache too', async () => {
    const k = `gone-${randomUUID()}`;
    const key = storageKeyOf(cached, 'json', k);
    const cache = cached.store as LocalCacheIdempotencyStore;
    expect(await cache.claim({ key, token: 'gone', fingerprint: '', leaseMs: 5000 })).toMatchObject({ status: 'acquired' });
    expect(await cache.complete(key, 'gone', { statusCode: 201, headers: {}, unreplayable: 'not_delivered' }, 60_000)).toBe(true);
    expect(await cache.claim({ key, token: 'seen', fingerprint: '', leaseMs: 5000 })).toMatchObject({ status: 'completed' });
    await eventually(() => holds(cached, key), { timeoutMs: 3000 });
    const fromRedis = await send(plain, 'json', k);
    const fromCache = await send(cached, 'json', k);
    expect(fromRedis.status).toBe(409);
    expect(JSON.parse(fromRedis.body.toString())).toMatchObject({ code: 'IDEMPOTENCY_RESPONSE_NOT_REPLAYABLE' });
    expect(comparable(fromCache)).toEqual(comparable(fromRedis));
    expect(runs.get(k)).toBeUndefined();
  });

  it('a saved 404 (saveStatuses): the same answer from the cache', async () => {
    const k = `miss-${randomUUID()}`;
    const { first, fromRedis, fromCache } = await both('missing', k);
    expect(first.status).toBe(404);
    expect(fromRedis.headers['idempotent-replayed']).toBe('true');
    expect(comparable(fromCache)).toEqual(comparable(fromRedis));
    expect(runs.get(k)).toBe(1);
  });

  it('waitForResultMs: 20 parallel duplicates on both instances wait for one run, then the cache answers', async () => {
    const k = `wait-${randomUUID()}`;
    const answers = await Promise.all(Array.from({ length: 20 }, (_, i) => send(i % 2 ? plain : cached, 'slow', k, { ms: 500 })));
    expect(answers.map((x) => x.status)).toEqual(Array(20).fill(201));
    expect(new Set(answers.map((x) => x.body.toString())).size).toBe(1);
    expect(runs.get(k)).toBe(1);
    await eventually(() => holds(cached, storageKeyOf(cached, 'slow', k)), { timeoutMs: 3000 });
    expect((await send(cached, 'slow', k, { ms: 500 })).body.toString()).toBe(answers[0].body.toString());
  });

  it('counts each replay from the cache once, with one replayed event', async () => {
    const k = `count-${randomUUID()}`;
    await send(cached, 'json', k);
    await send(cached, 'json', k);
    await eventually(() => holds(cached, storageKeyOf(cached, 'json', k)), { timeoutMs: 3000 });
    const counters = cached.app.get(IdempotencyCounters);
    const replayedBefore = counters.replayed;
    const eventsBefore = cached.events.filter((x) => x.type === 'replayed').length;
    await Promise.all(Array.from({ length: 25 }, () => send(cached, 'json', k)));
    expect(counters.replayed - replayedBefore).toBe(25);
    expect(cached.events.filter((x) => x.type === 'replayed').length - eventsBefore).toBe(25);
  });
});

describe('the cache answers a claim as the Redis store does, for every pair of fingerprints', () => {
  const keyPrefix = `rvfp${randomUUID().slice(0, 8)}`;
  let instance: Instance;
  beforeAll(async () => {
    instance = await start('express', { store: { redis: REDIS_URL }, keyPrefix, localCache: true });
  });
  afterAll(async () => instance?.app.close());

  it.each([
    ['', ''],
    ['', 'f1'],
    ['f1', ''],
    ['f1', 'f1'],
    ['f1', 'f2'],
  ])('record %j, claim %j', async (recordFingerprint, claimFingerprint) => {
    const cache = instance.store as LocalCacheIdempotencyStore;
    const redis = cache.store;
    const key = `${keyPrefix}:${randomUUID()}`;
    const claim = await cache.claim({ key, token: 't1', fingerprint: recordFingerprint, leaseMs: 5000 });
    expect(claim.status).toBe('acquired');
    expect(await cache.complete(key, 't1', { statusCode: 201, headers: { 'content-type': 'text/plain' }, body: 'done' }, 60_000)).toBe(true);
    expect(await cache.claim({ key, token: 'seen', fingerprint: recordFingerprint, leaseMs: 5000 })).toMatchObject({ status: 'completed' });
    await eventually(() => holds(instance, key), { timeoutMs: 3000 });
    const input = { key, token: 't2', fingerprint: claimFingerprint, leaseMs: 5000 };
    const fromCache = await cache.claim(input);
    const fromRedis = await redis.claim(input);
    expect(fromCache).toEqual(fromRedis);
  });
});
