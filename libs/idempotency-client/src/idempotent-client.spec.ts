import { describe, expect, it, jest } from '@jest/globals';
import { createIdempotentClient, type HeadersLike, type IdempotentClientOptions } from './idempotent-client.js';
import { IdempotentRequestError } from './idempotent-request.error.js';

type Step = Response | Error | 'hang';
interface Call {
  url: string;
  method: string;
  headers: Headers;
  body: unknown;
}

/** A fetch that plays `steps` in order (the last one again when they run out) and records each call. */
function scripted(...steps: Step[]): { fetch: typeof fetch; calls: Call[] } {
  const calls: Call[] = [];
  const fake = async (input: string | URL | Request, init: RequestInit = {}): Promise<Response> => {
    calls.push({ url: String(input), method: init.method ?? 'GET', headers: new Headers(init.headers), body: init.body });
    const step = steps[Math.min(calls.length - 1, steps.length - 1)];
    if (step === 'hang') {
      return new Promise((_resolve, reject) => init.signal?.addEventListener('abort', () => reject(init.signal!.reason)));
    }
    if (step instanceof Error) throw step;
    return step.clone();
  };
  return { fetch: fake as typeof fetch, calls };
}

const json = (status: number, body: unknown, headers: Record<string, string> = {}) =>
  new Response(JSON.stringify(body), { status, headers: { 'content-type': 'application/json', ...headers } });
const formWith = (name: string, value: string) => {
  const form = new FormData();
  form.append(name, value);
  return form;
};
const networkError = () => new TypeError('fetch failed', { cause: new Error('other side closed') });

const fast: Partial<IdempotentClientOptions> = { backoff: { baseMs: 1, maxMs: 5, jitter: 0 } };
const client = (fetch: typeof globalThis.fetch, options: Partial<IdempotentClientOptions> = {}) =>
  createIdempotentClient({ baseUrl: 'http://api.test/v1/', fetch, ...fast, ...options });

/** What a signal holds of the signals AbortSignal.any() made from it (Node's own field), 0 where none. */
const dependantsOf = (signal: AbortSignal) =>
  Object.getOwnPropertySymbols(signal)
    .filter((symbol) => String(symbol).includes('DependantSignals'))
    .reduce((count, symbol) => count + (((signal as unknown as Record<symbol, Set<unknown> | undefined>)[symbol])?.size ?? 0), 0);

describe('createIdempotentClient', () => {
  it("lets go of each attempt's signal when the caller passes one long-lived signal (a shutdown signal)", async () => {
    // AbortSignal.any() kept every attempt's signal in the caller's on Node 20 (nodejs/node#55351): the heap grew with every call.
    const shutdown = new AbortController().signal;
    const { fetch } = scripted(json(201, { id: 1 }));
    const api = client(fetch);
    for (let i = 0; i < 200; i++) await api.post('/orders', { i }, { signal: shutdown });
    expect(dependantsOf(shutdown)).toBe(0);
  });

  it('sends one generated key on every attempt and reports the replay', async () => {
    const { fetch, calls } = scripted(networkError(), json(503, {}), json(201, { id: 1 }, { 'idempotent-replayed': 'true' }));
    const res = await client(fetch).post('/orders', { amount: 5 });
    expect(res).toMatchObject({ status: 201, ok: true, body: { id: 1 }, replayed: true, attempts: 3 });
    expect(res.key).toMatch(/^[0-9a-f-]{36}$/);
    expect(calls.map((call) => call.headers.get('idempotency-key'))).toEqual([res.key, res.key, res.key]);
    expect(calls.map((call) => call.url)).toEqual(Array(3).fill('http://api.test/v1/orders'));
    expect(calls.map((call) => call.body)).toEqual(Array(3).fill('{"amount":5}'));
    expect(calls[0].headers.get('content-type')).toBe('application/json');
  });

  it('uses the given key, a custom header, the generator, and merges headers', async () => {
    const { fetch, calls } = scripted(json(201, {}));
    await client(fetch, { keyHeader: 'X-Request-Id', headers: { 'x-user-id': 'alice', 'x-a': '1' } }).post('/p', 'raw', {
      key: 'op-1',
      headers: { 'x-a': '2' },
    });
    expect(Object.fromEntries(calls[0].headers)).toEqual({ 'x-request-id': 'op-1', 'x-user-id': 'alice', 'x-a': '2' });
    expect(calls[0].body).toBe('raw');
    const generated = await client(fetch, { generateKey: () => 'gen-1' }).post('/p', {});
    expect(generated.key).toBe('gen-1');
  });

  it('sends no key header with keyHeader: false (the key is in the body)', async () => {
    const { fetch, calls } = scripted(networkError(), json(201, { orderNo: 'A' }));
    const res = await client(fetch, { keyHeader: false }).post('/orders', { orderNo: 'A' });
    expect(res).toMatchObject({ status: 201, attempts: 2, key: undefined, replayed: false });
    expect(calls.every((call) => !call.headers.has('idempotency-key'))).toBe(true);
  });

  // An adversarial helper: the key was reported but never sent, so on a fingerprint route two
  // operations keyed apart (same body) were one: the second got the first's replay, never run.
  it('refuses a { key } with keyHeader: false before sending anything: no header would carry it', async () => {
    const { fetch, calls } = scripted(json(201, {}));
    await expect(client(fetch, { keyHeader: false }).post('/rent', { amount: 1 }, { key: 'rent-march' })).rejects.toThrow(/keyHeader: false/);
    expect(calls).toHaveLength(0);
  });

  it.each([
    [400, { code: 'IDEMPOTENCY_KEY_MISSING' }, {}],
    [422, { code: 'IDEMPOTENCY_KEY_REUSED' }, {}],
    [409, { code: 'ORDER_EXISTS' }, {}],
    [429, {}, { 'retry-after': '1' }],
    [404, {}, {}],
  ])('returns a %i at once, without a retry', async (status, body, headers) => {
    const { fetch, calls } = scripted(json(status, body, headers), json(201, {}));
    const res = await client(fetch).post('/p', {});
    expect(res).toMatchObject({ status, ok: false, body, attempts: 1 });
    expect(calls).toHaveLength(1);
  });

  // helper-208: an outer TimeoutInterceptor answers 408 while the handler runs on: returned at
  // once as final, read as "did not happen", the operation was sent again under a new key.
  it('retries a 408 with the same key, as a 5xx: the handler may run on behind it', async () => {
    const { fetch, calls } = scripted(json(408, { statusCode: 408, message: 'Request Timeout' }), json(201, { id: 1 }, { 'idempotent-replayed': 'true' }));
    const res = await client(fetch).post('/p', {});
    expect(res).toMatchObject({ status: 201, replayed: true, attempts: 2 });
    expect(calls.map((call) => call.headers.get('idempotency-key'))).toEqual([res.key, res.key]);
  });

  it('waits the Retry-After of a 409 in progress, then gets the replay', async () => {
    const inProgress = json(409, { code: 'IDEMPOTENCY_IN_PROGRESS' }, { 'retry-after': '1' });
    const { fetch } = scripted(inProgress, json(201, { id: 1 }, { 'idempotent-replayed': 'true' }));
    const started = Date.now();
    const res = await client(fetch).post('/p', {});
    expect(Date.now() - started).toBeGreaterThanOrEqual(990);
    expect(res).toMatchObject({ status: 201, replayed: true, attempts: 2 });
  });

  it('returns the 409 at once when its Retry-After reaches past the time bound', async () => {
    const { fetch, calls } = scripted(json(409, { code: 'IDEMPOTENCY_IN_PROGRESS' }, { 'retry-after': '30' }));
    const started = Date.now();
    const res = await client(fetch, { timeoutMs: 5000 }).post('/p', {});
    expect(Date.now() - started).toBeLessThan(1000);
    expect(res).toMatchObject({ status: 409, attempts: 1 });
    expect(calls).toHaveLength(1);
  });

  it('returns the last 5xx once the retries are spent', async () => {
    const { fetch, calls } = scripted(json(502, { n: 1 }), json(500, { n: 2 }), json(503, { n: 3 }));
    const res = await client(fetch, { retries: 2 }).post('/p', {});
    expect(res).toMatchObject({ status: 503, body: { n: 3 }, attempts: 3 });
    expect(calls).toHaveLength(3);
  });

  it('throws IdempotentRequestError with the key, the attempts and the last cause when no attempt got an answer', async () => {
    const { fetch } = scripted(networkError());
    const error = await client(fetch, { retries: 2 }).post('/p', {}, { key: 'k-1' }).catch((e: unknown) => e);
    expect(error).toBeInstanceOf(IdempotentRequestError);
    expect(error).toMatchObject({ name: 'IdempotentRequestError', key: 'k-1', attempts: 3 });
    expect((error as Error).cause).toBeInstanceOf(TypeError);
  });

  it('bounds every attempt and the whole operation', async () => {
    const { fetch, calls } = scripted('hang');
    const started = Date.now();
    // A 1 s bound over 50 ms attempts: room for three attempts on a loaded machine (0.3 s was tight).
    const error = await client(fetch, { retries: 100, attemptTimeoutMs: 50, timeoutMs: 1000 }).post('/p', {}).catch((e: unknown) => e);
    const elapsed = Date.now() - started;
    expect(error).toBeInstanceOf(IdempotentRequestError);
    expect((error as Error).message).toMatch(/1000 ms bound/);
    expect(((error as Error).cause as Error).name).toBe('TimeoutError');
    expect(calls.length).toBeGreaterThanOrEqual(3);
    expect(elapsed).toBeGreaterThanOrEqual(950);
    expect(elapsed).toBeLessThan(10_000);
  });

  it('stops at once when the caller aborts, during an attempt or a wait', async () => {
    const inFlight = new AbortController();
    const hanging = client(scripted('hang').fetch).post('/p', {}, { signal: inFlight.signal });
    inFlight.abort(new Error('user left'));
    await expect(hanging).rejects.toThrow('user left');

    const waiting = new AbortController();
    const { fetch, calls } = scripted(json(503, {}, { 'retry-after': '10' }));
    const started = Date.now();
    const pending = client(fetch).post('/p', {}, { signal: waiting.signal });
    setTimeout(() => waiting.abort(), 50);
    await expect(pending).rejects.toMatchObject({ name: 'AbortError' });
    expect(Date.now() - started).toBeLessThan(1000);
    expect(calls).toHaveLength(1);

    const before = new AbortController();
    before.abort();
    await expect(client(fetch).post('/p', {}, { signal: before.signal })).rejects.toMatchObject({ name: 'AbortError' });
  });

  it('reads text and empty bodies, and refuses a stream body (it cannot be sent twice)', async () => {
    const { fetch } = scripted(new Response('plain', { status: 200, headers: { 'content-type': 'text/plain' } }));
    expect((await client(fetch).post('/p')).body).toBe('plain');
    const empty = scripted(new Response(null, { status: 204 }));
    expect((await client(empty.fetch).post('/p')).body).toBeUndefined();
    await expect(client(fetch).post('/p', new ReadableStream())).rejects.toThrow(/stream/);
  });

  it.each<[string, () => unknown]>([
    ['a Blob', () => new Blob(['<a/>'], { type: 'application/xml' })],
    ['a string', () => '{"orderNo":"A1"}'],
  ])('hands %s (which cannot change) to fetch as it is, on every attempt, with no Content-Type of its own', async (_what, make) => {
    const body = make();
    const { fetch, calls } = scripted(networkError(), json(201, {}));
    await client(fetch).post('/p', body);
    expect(calls).toHaveLength(2);
    for (const call of calls) expect(call.body).toBe(body);
    expect(calls.map((call) => call.headers.has('content-type'))).toEqual([false, false]);
  });

  it.each<[string, () => ArrayBuffer | ArrayBufferView]>([
    ['an ArrayBuffer', () => new Uint8Array([1, 2, 3]).buffer],
    ['a Uint8Array', () => new Uint8Array([1, 2, 3])],
    ['an Int16Array', () => new Int16Array([1, -2])],
    ['a DataView over part of a buffer', () => new DataView(new Uint8Array([9, 1, 2, 3, 9]).buffer, 1, 3)],
    ['a Buffer', () => Buffer.from('bytes')],
  ])('sends a copy of %s made at the call, the same on every attempt, with no Content-Type of its own', async (_what, make) => {
    const body = make();
    const bytes = body instanceof ArrayBuffer ? new Uint8Array(body) : new Uint8Array(body.buffer, body.byteOffset, body.byteLength);
    const { fetch, calls } = scripted(networkError(), json(201, {}));
    await client(fetch).post('/p', body);
    expect(calls).toHaveLength(2);
    expect(calls[1].body).toBe(calls[0].body);
    expect(calls[0].body).not.toBe(body);
    expect([...(calls[0].body as Uint8Array)]).toEqual([...bytes]);
    expect(calls.map((call) => call.headers.has('content-type'))).toEqual([false, false]);
  });

  it('sends a URLSearchParams as its text at the call, typed as a form', async () => {
    const { fetch, calls } = scripted(networkError(), json(201, {}));
    await client(fetch).post('/p', new URLSearchParams({ orderNo: 'A1', note: 'a b' }));
    expect(calls.map((call) => call.body)).toEqual(['orderNo=A1&note=a+b', 'orderNo=A1&note=a+b']);
    expect(calls[0].headers.get('content-type')).toBe('application/x-www-form-urlencoded;charset=UTF-8');
  });

  // An adversarial helper (session 20): handed to fetch as it is, each attempt got a new
  // boundary, and a route that fingerprints the raw body refused the retry 422.
  it('writes a FormData to multipart bytes once: every attempt sends the same bytes and boundary, over a Content-Type from the headers', async () => {
    const { fetch, calls } = scripted(networkError(), json(201, {}));
    const form = formWith('orderNo', 'A1');
    form.append('file', new Blob(['%PDF'], { type: 'application/pdf' }), 'a.pdf');
    await client(fetch, { headers: { 'content-type': 'application/json' } }).post('/p', form, { headers: { 'Content-Type': 'multipart/form-data' } });
    const [first, second] = calls.map((call) => ({ type: call.headers.get('content-type'), body: Buffer.from(call.body as Uint8Array).toString('latin1') }));
    expect(second).toEqual(first);
    const boundary = /^multipart\/form-data; boundary=(.+)$/.exec(first.type ?? '')?.[1];
    expect(boundary).toBeDefined();
    expect(first.body).toContain(`--${boundary}\r\nContent-Disposition: form-data; name="orderNo"\r\n\r\nA1\r\n`);
    expect(first.body).toContain('%PDF');
  });

  // An adversarial helper (session 20): a key in the headers was replaced by a new one, and a
  // re-send with it ran twice.
  it('takes a key the caller put in the headers as the operation\'s, and refuses two different keys', async () => {
    const { fetch, calls } = scripted(json(201, {}), json(201, {}));
    const answer = await client(fetch).post('/p', {}, { headers: { 'Idempotency-Key': 'mine-1' } });
    await client(fetch, { headers: { 'idempotency-key': 'mine-2' } }).post('/p', {});
    expect({ key: answer.key, sent: calls.map((call) => call.headers.get('idempotency-key')) }).toEqual({ key: 'mine-1', sent: ['mine-1', 'mine-2'] });
    await expect(client(fetch).post('/p', {}, { key: 'a', headers: { 'Idempotency-Key': 'b' } })).rejects.toThrow(/two keys for one operation/);
  });

  it('takes a header given as undefined for none: a key is generated, never the text "undefined"', async () => {
    // new Headers() wrote "undefined": every such call shared one key (an adversarial helper).
    const { fetch, calls } = scripted(json(201, {}));
    const none = undefined as unknown as string;
    await client(fetch, { headers: { 'Idempotency-Key': none } }).post('/p', {}, { headers: { 'Idempotency-Key': none, 'x-trace': none } });
    await client(fetch, { headers: [['Idempotency-Key', none]] }).post('/p', {}, { headers: [['x-trace', none]] });
    for (const call of calls) {
      expect({ key: call.headers.get('idempotency-key'), trace: call.headers.has('x-trace') }).toEqual({ key: expect.stringMatching(/^[0-9a-f-]{36}$/), trace: false });
    }
  });

  // An adversarial helper (session 20): a proxy that ended the answer by closing the connection
  // cut it, and the half JSON came back as a 201 with a text body.
  it('retries an answer whose JSON was cut (no Content-Length), and gets the whole replay', async () => {
    const cut = new Response('{"effectId":10', { status: 201, headers: { 'content-type': 'application/json' } });
    const { fetch, calls } = scripted(cut, json(201, { effectId: 1065 }, { 'idempotent-replayed': 'true', 'content-length': '18' }));
    const answer = await client(fetch).post('/p', {});
    expect({ body: answer.body, attempts: answer.attempts, calls: calls.length }).toEqual({ body: { effectId: 1065 }, attempts: 2, calls: 2 });
  });

  // An adversarial helper: a close-delimited JSON answer cut before its first byte came back as a
  // 201 with no body; the retry would have got the replay.
  it('retries a JSON answer cut before its first byte (empty, no Content-Length); an empty 204 is whole', async () => {
    const cut = new Response('', { status: 201, headers: { 'content-type': 'application/json' } });
    const { fetch, calls } = scripted(cut, json(201, { effectId: 7 }, { 'idempotent-replayed': 'true', 'content-length': '14' }));
    const answer = await client(fetch).post('/p', {});
    expect({ body: answer.body, attempts: answer.attempts, calls: calls.length }).toEqual({ body: { effectId: 7 }, attempts: 2, calls: 2 });
    const noContent = scripted(new Response(null, { status: 204, headers: { 'content-type': 'application/json' } }));
    expect(await client(noContent.fetch).post('/p', {})).toMatchObject({ status: 204, body: undefined, attempts: 1 });
  });

  // The same helper: headers given as a Map, or as another fetch's Headers class (undici's,
  // node-fetch's), were read as a record with no entries: the caller's key and Authorization were
  // dropped, and a re-sent operation went under a new key and ran twice.
  it('takes headers given as any iterable of pairs (a Map, another fetch library\'s Headers), the key among them', async () => {
    class ForeignHeaders {
      constructor(private readonly pairs: [string, string][]) {}
      *[Symbol.iterator](): Iterator<[string, string]> {
        yield* this.pairs;
      }
    }
    const { fetch, calls } = scripted(json(201, {}));
    const mapped = await client(fetch, { headers: new Map([['authorization', 'Bearer m']]) as unknown as HeadersLike }).post('/p', {}, {
      headers: new Map([['Idempotency-Key', 'map-key']]) as unknown as HeadersLike,
    });
    const foreign = await client(fetch).post('/p', {}, {
      headers: new ForeignHeaders([['Idempotency-Key', 'foreign-key'], ['Authorization', 'Bearer f']]) as unknown as HeadersLike,
    });
    expect({ keys: [mapped.key, foreign.key], sent: calls.map((call) => [call.headers.get('idempotency-key'), call.headers.get('authorization')]) }).toEqual({
      keys: ['map-key', 'foreign-key'],
      sent: [['map-key', 'Bearer m'], ['foreign-key', 'Bearer f']],
    });
  });

  // The same helper: node-fetch's answers carry a Node.js stream (no getReader), and every answer
  // was taken for a network error: a call whose every attempt got its 201 threw "without an answer".
  it("reads an answer whose body is a Node.js stream (node-fetch's), bounded by maxResponseBytes", async () => {
    const { Readable } = await import('node:stream');
    const nodeFetchLike = (text: string) =>
      (async () => ({
        status: 201,
        ok: true,
        headers: new Headers({ 'content-type': 'application/json', 'content-length': String(Buffer.byteLength(text)) }),
        body: Readable.from([Buffer.from(text.slice(0, 5)), Buffer.from(text.slice(5))]),
      })) as unknown as typeof fetch;
    expect(await client(nodeFetchLike('{"id":"é1"}')).post('/p', {})).toMatchObject({ status: 201, body: { id: 'é1' }, attempts: 1 });
    await expect(client(nodeFetchLike(JSON.stringify({ big: 'x'.repeat(100) })), { maxResponseBytes: 50 }).post('/p', {})).rejects.toThrow(/maxResponseBytes/);
  });

  // The same helper: a fetch of the caller's own that ignores the signal kept a call with timeoutMs
  // 500 for 3 s; one that throws as it is called (nothing sent) was retried as a network error; a
  // fetch that is no function was taken, and every call failed "without an answer".
  it("bounds a fetch of the caller's own that ignores the signal, throws what it throws as it is called, and refuses a fetch that is no function", async () => {
    const deaf = (() => new Promise<Response>((resolve) => setTimeout(() => resolve(json(201, {})), 3000).unref())) as typeof fetch;
    const started = Date.now();
    await expect(client(deaf, { timeoutMs: 200, retries: 0 }).post('/p', {})).rejects.toBeInstanceOf(IdempotentRequestError);
    expect(Date.now() - started).toBeLessThan(2000);
    let calls = 0;
    const broken = (() => {
      calls++;
      throw new TypeError('not configured');
    }) as typeof fetch;
    await expect(client(broken).post('/p', {})).rejects.toThrow('not configured');
    expect(calls).toBe(1);
    expect(() => client(42 as unknown as typeof fetch)).toThrow(/fetch must be a function/);
    // After an attempt went out (a circuit breaker opening), the error carries the key.
    let tries = 0;
    const breaker = (async () => {
      if (++tries === 1) throw networkError();
      throw new Error('circuit open');
    }) as unknown as typeof fetch;
    const syncBreaker = ((...args: Parameters<typeof fetch>) => {
      if (tries >= 1) throw new Error('circuit open');
      return breaker(...args);
    }) as typeof fetch;
    const thrown = await client(syncBreaker).post('/p', {}, { key: 'op-1' }).catch((error: unknown) => error);
    expect(thrown).toBeInstanceOf(IdempotentRequestError);
    expect(thrown).toMatchObject({ key: 'op-1', attempts: 1 });
  });

  it('sends plain objects, arrays, dates and values with toJSON, and class instances by their fields, as JSON', async () => {
    class OrderDto {
      constructor(
        readonly orderNo: string,
        readonly amount: number,
      ) {}
      total() {
        return this.amount;
      }
    }
    const { fetch, calls } = scripted(json(201, {}));
    const cases: [unknown, string][] = [
      [{ a: [1, 'x', null, true], at: new Date(0), skipped: undefined }, '{"a":[1,"x",null,true],"at":"1970-01-01T00:00:00.000Z"}'],
      [[{ a: 1 }], '[{"a":1}]'],
      [Object.assign(Object.create(null), { a: 1 }), '{"a":1}'],
      [{ money: { toJSON: () => '5.00 EUR' } }, '{"money":"5.00 EUR"}'],
      [new OrderDto('A1', 5), '{"orderNo":"A1","amount":5}'],
      [null, 'null'],
      [42, '42'],
    ];
    for (const [body] of cases) await client(fetch).post('/p', body);
    expect(calls.map((call) => call.body)).toEqual(cases.map(([, sent]) => sent));
    expect(calls.every((call) => call.headers.get('content-type') === 'application/json')).toBe(true);
  });

  it.each<[string, unknown, RegExp]>([
    ['a Map', new Map([['orderNo', 'A1']]), /Map/],
    ['a Set', new Set([1]), /Set/],
    ['a Map inside an object', { order: { lines: new Map() } }, /body\.order\.lines is a Map/],
    ['a typed array inside an object', { bytes: new Uint8Array([1]) }, /body\.bytes is a Uint8Array/],
    ['a DataView inside an array', [new DataView(new ArrayBuffer(1))], /body\[0\] is a DataView/],
    ['a FormData inside an object', { form: formWith('a', '1') }, /FormData/],
    ['an Error', new Error('boom'), /Error/],
    ['a RegExp', { pattern: /a/ }, /RegExp/],
    ['a Promise', { later: Promise.resolve(1) }, /Promise/],
    ['a custom iterable', { items: { *[Symbol.iterator]() {} } }, /iterable/],
    ['an async iterable', { async *[Symbol.asyncIterator]() {} }, /async iterable/],
    ['a function', { callback: () => 1 }, /function/],
    ['a symbol', { tag: Symbol('x') }, /symbol/],
    ['NaN', { amount: Number.NaN }, /NaN/],
    ['Infinity', [Number.POSITIVE_INFINITY], /Infinity/],
    ['a BigInt', { amount: 1n }, /BigInt/],
  ])('refuses %s with a TypeError before sending anything (JSON would not carry it as it is)', async (_what, body, message) => {
    const { fetch, calls } = scripted(json(201, {}));
    const error = await client(fetch).post('/p', body).catch((e: unknown) => e);
    expect(error).toBeInstanceOf(TypeError);
    expect((error as Error).message).toMatch(message);
    expect(calls).toHaveLength(0);
  });

  it.each<[string, string, unknown]>([
    ['a GET with a body', 'GET', { a: 1 }],
    ['a HEAD with a body', 'HEAD', 'x'],
    ['a method fetch forbids', 'CONNECT', undefined],
    ['a method that is not a token', 'PO ST', undefined],
  ])('refuses %s at once with the TypeError of fetch\'s Request, sending nothing', async (_what, method, body) => {
    const { fetch, calls } = scripted(json(200, {}));
    const error = await client(fetch).request(method, '/p', body).catch((e: unknown) => e);
    // fetch's errors come from Node's realm, not the test's: compared by name.
    expect(error).toMatchObject({ name: 'TypeError' });
    expect(error).not.toBeInstanceOf(IdempotentRequestError);
    expect(calls).toHaveLength(0);
  });

  it('leaves the URL to a fetch of the caller\'s own (a relative base URL it resolves itself)', async () => {
    const { fetch, calls } = scripted(json(201, { id: 1 }));
    const res = await createIdempotentClient({ baseUrl: '/api', fetch, ...fast }).post('/orders', { a: 1 });
    expect({ status: res.status, url: calls[0]?.url }).toEqual({ status: 201, url: '/api/orders' });
  });

  it('waits in full a Retry-After longer than a timer can hold (2^31 - 1 ms, 24.8 days) when timeoutMs allows it', async () => {
    jest.useFakeTimers({ doNotFake: ['nextTick', 'queueMicrotask', 'setImmediate'] });
    try {
      const retryAfterMs = 2_200_000 * 1000; // 25.5 days
      const { fetch, calls } = scripted(json(503, {}, { 'retry-after': '2200000' }), json(201, { id: 1 }));
      const pending = client(fetch, { timeoutMs: 3e9 }).post('/p', {});
      await jest.advanceTimersByTimeAsync(2 ** 31 - 1);
      expect(calls).toHaveLength(1);
      await jest.advanceTimersByTimeAsync(retryAfterMs - (2 ** 31 - 1) - 10);
      expect(calls).toHaveLength(1);
      await jest.advanceTimersByTimeAsync(10);
      expect(calls).toHaveLength(2);
      await expect(pending).resolves.toMatchObject({ status: 201, attempts: 2 });
    } finally {
      jest.useRealTimers();
    }
  });

  // An adversarial helper's finds (session 25): each case below failed on the code before.
  it('sends the bytes and the form a body held when the call was made, on every attempt, however the caller changes them after', async () => {
    const { fetch, calls } = scripted(networkError(), networkError(), json(201, {}));
    const form = new URLSearchParams({ amount: '5' });
    const bytes = new TextEncoder().encode('amount=5');
    const api = client(fetch);
    const sentForm = api.post('/p', form);
    form.set('amount', '500');
    await sentForm;
    const sentBytes = api.post('/p', bytes);
    bytes.set(new TextEncoder().encode('amount=9'));
    await sentBytes;
    const texts = calls.map((call) => (typeof call.body === 'string' ? call.body : new TextDecoder().decode(call.body as Uint8Array)));
    expect(texts).toEqual([...Array(3).fill('amount=5'), 'amount=5']);
    expect(calls[0].headers.get('content-type')).toBe('application/x-www-form-urlencoded;charset=UTF-8');
  });

  it('follows no redirect: a 3xx is the answer, and the key and body never reach its Location', async () => {
    let init: RequestInit | undefined;
    const fetch = (async (_url: string, options: RequestInit) => {
      init = options;
      return new Response(null, { status: 307, headers: { location: 'http://elsewhere.test/evil' } });
    }) as unknown as typeof globalThis.fetch;
    const res = await client(fetch).post('/p', { amount: 5 });
    expect(init?.redirect).toBe('manual');
    expect(res).toMatchObject({ status: 307, ok: false, attempts: 1 });
  });

  it('refuses an answer over maxResponseBytes, reading no more of it, and does not retry it', async () => {
    let pulled = 0;
    const endless = () =>
      new Response(
        new ReadableStream({
          pull(controller) {
            pulled++;
            controller.enqueue(new Uint8Array(64 * 1024));
          },
        }),
        { status: 200 },
      );
    let sent = 0;
    const fetch = (async () => (sent++, endless())) as unknown as typeof globalThis.fetch;
    const error = await client(fetch, { maxResponseBytes: 1024 * 1024 }).post('/p', {}).catch((e: unknown) => e);
    expect(error).toBeInstanceOf(IdempotentRequestError);
    expect((error as Error).message).toMatch(/over maxResponseBytes \(1048576\)/);
    expect(sent).toBe(1);
    expect(pulled).toBeLessThan(40);
  });

  it('waits out a 409 in progress within timeoutMs without spending its retries, and gets the replay', async () => {
    const inProgress = json(409, { code: 'IDEMPOTENCY_IN_PROGRESS' });
    const { fetch, calls } = scripted(inProgress, inProgress, inProgress, inProgress, inProgress, inProgress, json(201, { id: 7 }, { 'idempotent-replayed': 'true' }));
    const res = await client(fetch, { retries: 2 }).post('/p', {});
    expect(res).toMatchObject({ status: 201, replayed: true, attempts: 7 });
    expect(calls).toHaveLength(7);
  });

  it('waits at least the backoff between 409s in progress that say Retry-After: 0, and spends retries on a 409 not in progress', async () => {
    const zero = json(409, { code: 'IDEMPOTENCY_IN_PROGRESS' }, { 'retry-after': '0' });
    const slow = scripted(zero, zero, zero, json(201, {}));
    const startedAt = Date.now();
    await client(slow.fetch, { backoff: { baseMs: 50, maxMs: 50, jitter: 0 } }).post('/p', {});
    expect(Date.now() - startedAt).toBeGreaterThanOrEqual(140);
    const other = json(409, { code: 'SOMETHING_ELSE' }, { 'retry-after': '0' });
    const spent = scripted(other);
    expect(await client(spent.fetch, { retries: 2 }).post('/p', {})).toMatchObject({ status: 409, attempts: 3 });
  });

  it('sends a DTO with fields and a convenience getter by its fields', async () => {
    class Line {
      constructor(
        readonly price: number,
        readonly quantity: number,
      ) {}
      get total() {
        return this.price * this.quantity;
      }
    }
    const { fetch, calls } = scripted(json(201, {}));
    await client(fetch).post('/p', { line: new Line(2, 3) });
    expect(calls[0].body).toBe('{"line":{"price":2,"quantity":3}}');
  });

  it('returns the last answer it got when later attempts got none', async () => {
    const { fetch } = scripted(json(503, { code: 'X' }), networkError(), networkError(), networkError());
    expect(await client(fetch, { retries: 3 }).post('/p', {})).toMatchObject({ status: 503, body: { code: 'X' }, attempts: 4 });
  });

  it('refuses a class instance whose content is in getters (JSON would write {}), before sending', async () => {
    class Money {
      #amount = 5;
      get amount() {
        return this.#amount;
      }
    }
    const { fetch, calls } = scripted(json(201, {}));
    await expect(client(fetch).post('/p', { price: new Money() })).rejects.toThrow(/body\.price is a Money whose content is in getters/);
    expect(calls).toHaveLength(0);
  });

  // An adversarial helper: these went changed, in silence, where the README promises a TypeError
  // before anything is sent: a Buffer by its toJSON ({"type":"Buffer","data":[...]}), a boxed NaN
  // as null, an instance with only #private fields and methods as {}, an invalid Date as null.
  it.each([
    ['bytes inside an object (a Buffer, by its toJSON)', { file: Buffer.from('secret') }, /body\.file is a Buffer/],
    ['bytes in an array', [new Uint8Array([1, 2])], /body\[0\] is a Uint8Array/],
    ['a boxed NaN', { amount: new Number(Number.NaN) }, /body\.amount is NaN/],
    ['a boxed Infinity', { amount: new Number(Number.POSITIVE_INFINITY) }, /body\.amount is Infinity/],
    ['an invalid Date', { at: new Date('nope') }, /body\.at is an invalid Date/],
    ['an object whose fields are inherited', { order: Object.create({ orderNo: 'o1' }) as object }, /body\.order is an object whose fields are inherited \(JSON writes only its own fields: orderNo\)/],
  ])('refuses %s, before sending', async (_what, body, message) => {
    const { fetch, calls } = scripted(json(201, {}));
    await expect(client(fetch).post('/p', body)).rejects.toThrow(message);
    expect(calls).toHaveLength(0);
  });

  // A reviewing helper: the rules above must not refuse what JSON writes as meant: a DTO whose
  // optional fields are unset (no own field with legacy class fields), bytes with a toJSON of
  // their own; and a getter runs once, as JSON.stringify runs it.
  it('still sends plain and empty objects, empty DTOs, boxed finite numbers, valid Dates, toJSON classes and bytes with their own toJSON', async () => {
    class Id {
      #value = 'o1';
      toJSON() {
        return this.#value;
      }
    }
    class ConfirmDto {
      declare note?: string;
    }
    class Signature extends Uint8Array {
      toJSON() {
        return Buffer.from(this).toString('base64');
      }
    }
    let reads = 0;
    const counted = {
      get total() {
        return ++reads;
      },
    };
    const { fetch, calls } = scripted(json(201, {}));
    const body = { empty: {}, none: Object.create(null), dto: new ConfirmDto(), n: new Number(2), at: new Date(0), id: new Id(), sig: new Signature([1, 2, 3]), counted };
    await client(fetch).post('/p', body);
    expect(calls[0].body).toBe('{"empty":{},"none":{},"dto":{},"n":2,"at":"1970-01-01T00:00:00.000Z","id":"o1","sig":"AQID","counted":{"total":1}}');
    expect(reads).toBe(1);
  });

  // An adversarial helper: backoff.baseMs 0 with retries 0 sent 506 requests in 2 s to a route
  // answering 409 in progress with Retry-After: 0 (waits in progress spend no retry).
  it('waits at least 50 ms between 409s in progress, whatever backoff.baseMs says', async () => {
    const zero = json(409, { code: 'IDEMPOTENCY_IN_PROGRESS' }, { 'retry-after': '0' });
    const { fetch, calls } = scripted(...Array.from({ length: 100 }, () => zero));
    const answer = await client(fetch, { retries: 0, timeoutMs: 500, backoff: { baseMs: 0 } }).post('/p', {});
    expect(answer.status).toBe(409);
    expect(calls.length).toBeLessThanOrEqual(11);
  });

  it('checks its options', () => {
    expect(() => createIdempotentClient({ baseUrl: 'http://x', attemptTimeoutMs: 2 ** 31 })).toThrow(/attemptTimeoutMs.*2147483647/);
    expect(() => createIdempotentClient({ baseUrl: 'http://x', retries: -1 })).toThrow(/retries/);
    expect(() => createIdempotentClient({ baseUrl: 'http://x', attemptTimeoutMs: 0 })).toThrow(/attemptTimeoutMs must be at least 1/);
    expect(() => createIdempotentClient({ baseUrl: 'http://x', attemptTimeoutMs: 0.5 })).toThrow(/attemptTimeoutMs must be at least 1/);
    expect(() => createIdempotentClient({ baseUrl: 'http://x', timeoutMs: 0 })).toThrow(/timeoutMs must be at least 1/);
    expect(() => createIdempotentClient({ baseUrl: 'http://x', backoff: { baseMs: Number.NaN } })).toThrow(/baseMs/);
    expect(() => createIdempotentClient({ baseUrl: 'http://x', backoff: { baseMs: undefined } })).not.toThrow();
  });
});
