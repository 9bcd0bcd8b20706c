// The local cache's bounds (maxEntries, maxBytes) under a flood of distinct keys,
// and what the entries really hold in memory against "Memory: at most maxBytes, per process".
import { afterAll, beforeAll, describe, expect, it } from '@jest/globals';
import { Body, Controller, Post, type INestApplication } from '@nestjs/common';
import { randomUUID } from 'node:crypto';
import { setFlagsFromString } from 'node:v8';
import { runInNewContext } from 'node:vm';
import {
  IdempotencyStore,
  LocalCacheIdempotencyStore,
  NoRepeatSubmit,
  type IdempotencyModuleOptions,
  type SavedResponse,
} from 'nestjs-idempotency';
import { eventually } from './support/eventually.js';
import { patientRedis } from './support/services.js';
import { makeApp } from './support/edge-app.js';

@Controller('flood')
class FloodController {
  @Post()
  @NoRepeatSubmit({ expireSeconds: 600 })
  create(@Body() body: { k: string; size: number }) {
    return { k: body.k, pad: 'p'.repeat(body.size) };
  }
}

async function start(options: IdempotencyModuleOptions): Promise<{ app: INestApplication; url: string; cache: LocalCacheIdempotencyStore }> {
  const { app, url } = await makeApp('express', [FloodController], options);
  return { app, url, cache: app.get(IdempotencyStore) as LocalCacheIdempotencyStore };
}

const post = (url: string, k: string, size: number) =>
  fetch(`${url}/flood`, {
    method: 'POST',
    headers: { 'content-type': 'application/json', 'idempotency-key': k },
    body: JSON.stringify({ k, size }),
  }).then(async (res) => {
    const body = Buffer.from(await res.arrayBuffer());
    // A refusal's body is kept whole, so a failure says what answered (a 503, a 409, ...).
    return { status: res.status, replayed: res.headers.get('idempotent-replayed') === 'true', bytes: body.byteLength, ...(res.status >= 300 ? { refusal: body.toString('utf8') } : {}) };
  });

describe('localCache bounds under a flood of distinct keys (HTTP, Express)', () => {
  const keyPrefix = `rvbd${randomUUID().slice(0, 8)}`;
  const maxBytes = 256 * 1024;
  const maxEntries = 40;
  let instance: Awaited<ReturnType<typeof start>>;
  beforeAll(async () => {
    // About bounds, not latency: a save that times out on a loaded machine answers its retry 409.
    instance = await start({ store: { redis: patientRedis() }, keyPrefix, localCache: { maxEntries, maxBytes } });
    await eventually(() => instance.cache.cacheStats().live, { timeoutMs: 3000 });
  });
  afterAll(async () => instance?.app.close());

  it('600 keys with bodies of 1 to 40 KB, 30 at a time, then their replays: entries and bytes stay within the bounds', async () => {
    const seen: { entries: number; bytes: number }[] = [];
    const keys = Array.from({ length: 600 }, (_, i) => ({ k: `f${i}-${randomUUID()}`, size: 1000 + ((i * 7919) % 40_000) }));
    for (let i = 0; i < keys.length; i += 30) {
      const batch = keys.slice(i, i + 30);
      const answers = await Promise.all(batch.map(({ k, size }) => post(instance.url, k, size)));
      expect(answers.filter((x) => x.status !== 201)).toEqual([]);
      seen.push(instance.cache.cacheStats());
      // Replays of recent keys: the cache answers some, Redis the others.
      const replays = await Promise.all(batch.map(({ k, size }) => post(instance.url, k, size)));
      expect(replays.filter((x) => x.status !== 201 || !x.replayed)).toEqual([]);
      seen.push(instance.cache.cacheStats());
    }
    await new Promise((resolve) => setTimeout(resolve, 200));
    seen.push(instance.cache.cacheStats());
    expect(seen.filter((x) => x.entries > maxEntries || x.bytes > maxBytes)).toEqual([]);
    expect(seen.at(-1)!.entries).toBeGreaterThan(0);
    // A record over maxBytes alone is not kept, and never answers wrong.
    const huge = `huge-${randomUUID()}`;
    await post(instance.url, huge, 300 * 1024);
    expect(await post(instance.url, huge, 300 * 1024)).toMatchObject({ status: 201, replayed: true });
    await new Promise((resolve) => setTimeout(resolve, 200));
    expect(instance.cache.cacheStats().bytes).toBeLessThanOrEqual(maxBytes);
    expect(await post(instance.url, huge, 300 * 1024)).toMatchObject({ status: 201, replayed: true });
    // 1,200 requests of up to 40 KB: seconds here, more on a loaded CI machine.
  }, 120_000);
});

/** The heap in use after full collections. */
function heapUsed(gc: () => void): number {
  for (let i = 0; i < 4; i++) gc();
  return process.memoryUsage().heapUsed;
}

describe('localCache: what the entries hold in memory against maxBytes (README: "Memory: at most maxBytes, per process")', () => {
  const keyPrefix = `rvmem${randomUUID().slice(0, 8)}`;
  let instance: Awaited<ReturnType<typeof start>>;
  let gc: () => void;
  const maxBytes = 4 * 1024 * 1024;

  beforeAll(async () => {
    setFlagsFromString('--expose-gc');
    gc = runInNewContext('gc') as () => void;
    instance = await start({ store: { redis: patientRedis() }, keyPrefix, localCache: { maxEntries: 1_000_000, maxBytes } });
    await eventually(() => instance.cache.cacheStats().live, { timeoutMs: 3000 });
  });
  afterAll(async () => instance?.app.close());

  /** Saves `count` records through the cache, as the guard saves answers, and replays each once; waits until they are held. */
  async function fill(count: number, answer: (i: number) => SavedResponse): Promise<void> {
    const cache = instance.cache;
    for (let i = 0; i < count; i += 200) {
      await Promise.all(
        Array.from({ length: Math.min(200, count - i) }, async (_, j) => {
          const key = `${keyPrefix}:anon::FloodController.create:${randomUUID()}`;
          const token = randomUUID();
          await cache.claim({ key, token, fingerprint: 'a'.repeat(64), leaseMs: 10_000 });
          await cache.complete(key, token, answer(i + j), 600_000);
          await cache.claim({ key, token: randomUUID(), fingerprint: 'a'.repeat(64), leaseMs: 10_000 });
        }),
      );
    }
    await new Promise((resolve) => setTimeout(resolve, 300));
  }

  // What an entry counts must cover what V8 holds: the objects and the map's slot (a flat 200 bytes
  // was about a third too few for a small answer), and two bytes a character for text outside
  // Latin-1 (counted as one, the entries held ~1.9x and ~2.1x maxBytes).
  it.each([
    ['small JSON answers (40 bytes of body, content-type and etag)', 20_000, (i: number) => ({ statusCode: 201, headers: { 'content-type': 'application/json; charset=utf-8', etag: `W/"${i}"` }, body: `{"id":${i},"status":"created","ok":true}` })],
    ['answers of 20,000 CJK characters (flat strings: two bytes a character in V8)', 300, (i: number) => ({ statusCode: 201, headers: { 'content-type': 'text/plain; charset=utf-8' }, body: Buffer.from(`${i}:${'日本語テキスト'.repeat(2857)}`).toString('utf8') })],
  ])('%s: the heap the entries hold stays within maxBytes', async (_name, count, answer) => {
    instance.cache.reset();
    const before = heapUsed(gc);
    await fill(count, answer);
    const stats = instance.cache.cacheStats();
    const held = heapUsed(gc) - before;
    expect(stats.bytes).toBeLessThanOrEqual(maxBytes);
    expect(stats.entries).toBeGreaterThan(0);
    // Control: emptied, the cache gives that memory back (so `held` is the entries' own).
    instance.cache.reset();
    expect(heapUsed(gc) - before).toBeLessThan(held * 0.1);
    // The heap the entries hold (counted: stats.bytes), within maxBytes plus 10% slack for the rest of the process.
    expect(held).toBeLessThanOrEqual(maxBytes * 1.1);
  }, 60_000);
});
