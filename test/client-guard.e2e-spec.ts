import { afterAll, beforeAll, beforeEach, describe, expect, it } from '@jest/globals';
import type { INestApplication } from '@nestjs/common';
import { randomUUID } from 'node:crypto';
import {
  createIdempotentClient,
  IDEMPOTENCY_KEY_HEADER,
  REPLAYED_HEADER,
  type IdempotentClientOptions,
} from '../libs/idempotency-client/src/index.js';
import { IDEMPOTENCY_KEY_HEADER as SERVER_KEY_HEADER, REPLAYED_HEADER as SERVER_REPLAYED_HEADER } from '../libs/idempotency/src/index.js';
import { createGuardTestApp, Probe, type AdapterName } from './support/guard-test.app.js';
import { until } from './support/http.js';
import { REDIS_URL } from './support/services.js';

/** What a fault does to one attempt: fail before sending, or send it and lose the answer behind a 502. */
type Fault = 'network-before-send' | 'gateway-502-after-send';
interface Sent {
  key: string | null;
  status: number | 'network-error';
  retryAfter: string | null;
  at: number;
}

/** The global fetch, recording each attempt and applying the queued faults in order. */
function recordingFetch(faults: Fault[] = []): { fetch: typeof fetch; sent: Sent[] } {
  const sent: Sent[] = [];
  const wrapped = async (input: string | URL | Request, init: RequestInit = {}): Promise<Response> => {
    const key = new Headers(init.headers).get(IDEMPOTENCY_KEY_HEADER);
    const fault = faults.shift();
    if (fault === 'network-before-send') {
      sent.push({ key, status: 'network-error', retryAfter: null, at: Date.now() });
      throw new TypeError('fetch failed', { cause: new Error('connect ECONNRESET') });
    }
    const res = await fetch(input, init);
    if (fault === 'gateway-502-after-send') {
      await res.arrayBuffer();
      sent.push({ key, status: 502, retryAfter: null, at: Date.now() });
      return new Response('Bad Gateway', { status: 502 });
    }
    sent.push({ key, status: res.status, retryAfter: res.headers.get('retry-after'), at: Date.now() });
    return res;
  };
  return { fetch: wrapped as typeof fetch, sent };
}

/** The Idempotency-Key header mode, against the guard test app's `POST /payments`. */
describe.each<AdapterName>(['express', 'fastify'])('the idempotent client on a route keyed by Idempotency-Key (%s)', (adapter) => {
  let app: INestApplication;
  let probe: Probe;
  let baseUrl: string;
  const client = (fetch: typeof globalThis.fetch, options: Partial<IdempotentClientOptions> = {}) =>
    createIdempotentClient({ baseUrl, fetch, backoff: { baseMs: 10, maxMs: 100, jitter: 0.5 }, timeoutMs: 15_000, ...options });

  beforeAll(async () => {
    // A 2 s lease: the guard's Retry-After on a 409 is the lease left, which the client waits.
    app = await createGuardTestApp(adapter, { store: { redis: REDIS_URL }, keyPrefix: `client-guard-${randomUUID()}`, leaseSeconds: 2 });
    probe = app.get(Probe);
    await app.listen(0, '127.0.0.1');
    baseUrl = (await app.getUrl()).replace('[::1]', '127.0.0.1');
  });
  afterAll(async () => app?.close());
  beforeEach(() => {
    probe.runs = 0;
    probe.failuresLeft = 0;
    probe.release();
  });

  it('uses the header names of the guard', () => {
    expect(IDEMPOTENCY_KEY_HEADER.toLowerCase()).toBe(SERVER_KEY_HEADER);
    expect(REPLAYED_HEADER).toBe(SERVER_REPLAYED_HEADER);
  });

  it('sends one key on every attempt: a network error, then a 502 after the server ran it, then the replay', async () => {
    const { fetch, sent } = recordingFetch(['network-before-send', 'gateway-502-after-send']);
    const res = await client(fetch).post('/payments', { amount: 5 });

    expect(res).toMatchObject({ status: 201, replayed: true, attempts: 3, body: { paid: { amount: 5 }, run: 1 } });
    expect(sent.map((s) => s.status)).toEqual(['network-error', 502, 201]);
    expect(sent.map((s) => s.key)).toEqual([res.key, res.key, res.key]);
    expect(probe.runs).toBe(1);
  });

  it('gives each operation its own key', async () => {
    const { fetch, sent } = recordingFetch();
    const a = await client(fetch).post('/payments', { amount: 5 });
    const b = await client(fetch).post('/payments', { amount: 5 });
    expect(a.key).not.toBe(b.key);
    expect([a.replayed, b.replayed]).toEqual([false, false]);
    expect(sent.map((s) => s.key)).toEqual([a.key, b.key]);
    expect(probe.runs).toBe(2);
  });

  it('retries a 409 in progress after its Retry-After until the replay', async () => {
    const key = randomUUID();
    probe.hold();
    const first = client(recordingFetch().fetch).post('/payments', { amount: 7 }, { key });
    await until(() => probe.runs === 1);

    const duplicate = recordingFetch();
    const second = client(duplicate.fetch).post('/payments', { amount: 7 }, { key });
    await until(() => duplicate.sent.length === 1);
    probe.release();

    const [a, b] = await Promise.all([first, second]);
    expect(a).toMatchObject({ status: 201, replayed: false, attempts: 1 });
    expect(b).toMatchObject({ status: 201, replayed: true, attempts: 2, key, body: a.body });
    const [conflict, replay] = duplicate.sent;
    expect(conflict).toMatchObject({ status: 409, key });
    const retryAfterMs = Number(conflict.retryAfter) * 1000;
    expect(retryAfterMs).toBeGreaterThanOrEqual(1000);
    expect(replay.at - conflict.at).toBeGreaterThanOrEqual(retryAfterMs - 50);
    expect(probe.runs).toBe(1);
  });

  it('does not retry a 400: without a key header the route answers IDEMPOTENCY_KEY_MISSING once', async () => {
    const { fetch, sent } = recordingFetch();
    const res = await client(fetch, { keyHeader: false }).post('/payments', { amount: 5 });
    expect(res).toMatchObject({ status: 400, attempts: 1, body: { code: 'IDEMPOTENCY_KEY_MISSING' } });
    expect(sent).toHaveLength(1);
    expect(probe.runs).toBe(0);
  });
});
