import { afterAll, beforeAll, beforeEach, describe, expect, it } from '@jest/globals';
import type { INestApplication } from '@nestjs/common';
import { randomUUID } from 'node:crypto';
import request from 'supertest';
import { IdempotencyCounters, IdempotencyStore, buildStorageKey } from '../libs/idempotency/src/index.js';
import { createGuardTestApp, Probe, type AdapterName } from './support/guard-test.app.js';
import { fire, until } from './support/http.js';
import { REDIS_URL } from './support/services.js';

describe.each<AdapterName>(['express', 'fastify'])('the entry guard on Redis (%s)', (adapter) => {
  let app: INestApplication;
  let probe: Probe;
  let key: string;
  let baseUrl: string;
  const prefix = `guard-e2e-${randomUUID()}`;
  const http = () => request(app.getHttpServer());

  beforeAll(async () => {
    app = await createGuardTestApp(adapter, {
      store: { redis: REDIS_URL },
      keyPrefix: prefix,
      getUser: (ctx) => ctx.switchToHttp().getRequest<{ headers: Record<string, string> }>().headers['x-user'],
    });
    probe = app.get(Probe);
    await app.listen(0, '127.0.0.1');
    baseUrl = (await app.getUrl()).replace('[::1]', '127.0.0.1');
  });
  afterAll(async () => app.close());
  beforeEach(() => {
    probe.runs = 0;
    probe.failuresLeft = 0;
    probe.release();
    key = randomUUID();
  });

  it('replays the first response with Idempotent-Replayed, its allowlisted headers and not its cookies', async () => {
    const first = await http().post('/payments').set('Idempotency-Key', key).send({ amount: 5 });
    expect(first.status).toBe(201);
    expect(first.body).toEqual({ paid: { amount: 5 }, run: 1 });
    expect(first.headers['idempotent-replayed']).toBeUndefined();

    const again = await http().post('/payments').set('Idempotency-Key', key).send({ amount: 5 });
    expect(again.status).toBe(201);
    expect(again.body).toEqual(first.body);
    expect(again.headers['idempotent-replayed']).toBe('true');
    expect(again.headers['location']).toBe('/payments/1');
    expect(again.headers['content-type']).toMatch(/^application\/json/);
    expect(probe.runs).toBe(1);
  });

  it('never replays a cookie set by the first response', async () => {
    await http().post('/payments').set('Idempotency-Key', key).send({ amount: 5 });
    // @Header() sets Set-Cookie on every run, so a replay must not carry one the guard saved:
    // the replayed response has exactly the cookie the route sets itself, not two.
    const again = await http().post('/payments').set('Idempotency-Key', key).send({ amount: 5 });
    expect(again.headers['idempotent-replayed']).toBe('true');
    expect([again.headers['set-cookie']].flat()).toHaveLength(1);
  });

  it('saves no request header, cookie or Set-Cookie with the response', async () => {
    await http()
      .post('/payments')
      .set('Idempotency-Key', key)
      .set('x-user', 'alice')
      .set('Authorization', 'Bearer top-secret-token')
      .set('Cookie', 'session=request-cookie')
      .send({ amount: 5 });
    const storageKey = buildStorageKey({ prefix, user: { id: 'alice' }, handler: 'GuardTestController.pay', key });
    const record = await app.get(IdempotencyStore).get(storageKey);
    expect(record?.state).toBe('completed');
    // The allowlisted headers as sent (Express adds a weak ETag of its own).
    const sent = adapter === 'express' ? ['content-type', 'etag', 'location'] : ['content-type', 'location'];
    expect(Object.keys(record!.response!.headers).sort()).toEqual(sent);
    expect(JSON.stringify(record)).not.toMatch(/top-secret-token|request-cookie|session=secret/);
  });

  it('takes the structured-field form "key" and the bare form key as the same key', async () => {
    await http().post('/payments').set('Idempotency-Key', `"${key}"`).send({ amount: 5 });
    const again = await http().post('/payments').set('Idempotency-Key', key).send({ amount: 5 });
    expect(again.headers['idempotent-replayed']).toBe('true');
    expect(probe.runs).toBe(1);
  });

  it('answers 409 with Retry-After while the first request is in flight', async () => {
    probe.hold();
    const first = fire(http().post('/payments').set('Idempotency-Key', key).send({ amount: 5 }));
    await until(() => probe.runs === 1);
    const duplicate = await http().post('/payments').set('Idempotency-Key', key).send({ amount: 5 });
    expect(duplicate.status).toBe(409);
    expect(duplicate.body).toMatchObject({ statusCode: 409, code: 'IDEMPOTENCY_IN_PROGRESS' });
    expect(Number(duplicate.headers['retry-after'])).toBeGreaterThanOrEqual(1);
    probe.release();
    expect((await first).status).toBe(201);
    const replay = await http().post('/payments').set('Idempotency-Key', key).send({ amount: 5 });
    expect(replay.headers['idempotent-replayed']).toBe('true');
    expect(probe.runs).toBe(1);
  });

  it('lets 100 concurrent duplicates wait for the first result instead of a 409, with one handler run', async () => {
    probe.hold();
    const send = () =>
      fetch(`${baseUrl}/waiting`, {
        method: 'POST',
        headers: { 'content-type': 'application/json', 'idempotency-key': key },
        body: '{"amount":5}',
      }).then(async (res) => ({ status: res.status, replayed: res.headers.get('idempotent-replayed'), body: await res.json() }));
    const first = send();
    await until(() => probe.runs === 1);
    const counters = app.get(IdempotencyCounters);
    const waitedBefore = counters.waited;
    const duplicates = Array.from({ length: 100 }, send);
    await until(() => counters.waited - waitedBefore === 100, 10_000);
    probe.release();
    const answers = await Promise.all([first, ...duplicates]);
    expect(answers.map((a) => a.status)).toEqual(Array(101).fill(201));
    expect(probe.runs).toBe(1);
    expect(answers.filter((a) => a.replayed !== 'true')).toEqual([answers[0]]);
    for (const answer of answers) expect(answer.body).toEqual({ got: { amount: 5 }, run: 1 });
    expect(probe.runs).toBe(1);
  });

  it('answers 409 when the first result does not come within waitForResultMs', async () => {
    probe.hold();
    const first = fire(http().post('/waiting-briefly').set('Idempotency-Key', key));
    await until(() => probe.runs === 1);
    const duplicate = await http().post('/waiting-briefly').set('Idempotency-Key', key);
    expect(duplicate.status).toBe(409);
    expect(duplicate.body.code).toBe('IDEMPOTENCY_IN_PROGRESS');
    probe.release();
    expect((await first).status).toBe(201);
  });

  it('lets a retry take over after the lease of a slow handler, and refuses the late completion', async () => {
    const counters = app.get(IdempotencyCounters);
    const lateBefore = counters.lateCompletions;
    probe.hold();
    const slow = fire(http().post('/short-lease').set('Idempotency-Key', key));
    await until(() => probe.runs === 1);
    probe.letNewRunsThrough();
    let retry = await http().post('/short-lease').set('Idempotency-Key', key);
    expect(retry.status).toBe(409);
    // The 2 s lease runs out while the first handler is still held.
    await until(async () => {
      retry = await http().post('/short-lease').set('Idempotency-Key', key);
      return retry.status !== 409;
    }, 10_000);
    expect(retry.status).toBe(201);
    expect(retry.body).toEqual({ run: 2 });

    probe.release();
    expect((await slow).body).toEqual({ run: 1 }); // its client still gets its answer...
    expect(counters.lateCompletions).toBe(lateBefore + 1); // ...but it is not saved over the retry's
    const replay = await http().post('/short-lease').set('Idempotency-Key', key);
    expect(replay.headers['idempotent-replayed']).toBe('true');
    expect(replay.body).toEqual({ run: 2 });
    expect(probe.runs).toBe(2);
  });

  it('answers 422 when the key comes again with another payload', async () => {
    await http().post('/payments').set('Idempotency-Key', key).send({ amount: 5 });
    const reused = await http().post('/payments').set('Idempotency-Key', key).send({ amount: 6 });
    expect(reused.status).toBe(422);
    expect(reused.body).toMatchObject({ code: 'IDEMPOTENCY_KEY_REUSED' });
    expect(probe.runs).toBe(1);
  });

  it('answers 400 IDEMPOTENCY_KEY_MISSING without a key', async () => {
    const res = await http().post('/payments').send({ amount: 5 });
    expect(res.status).toBe(400);
    expect(res.body).toMatchObject({ statusCode: 400, code: 'IDEMPOTENCY_KEY_MISSING' });
    expect(res.body.message).toMatch(/Idempotency-Key/);
    expect(probe.runs).toBe(0);
  });

  it.each([
    ['too long', 'k'.repeat(256)],
    ['empty', ''],
    ['a control character', 'a\tb'],
    ['an empty structured string', '""'],
  ])('answers 400 IDEMPOTENCY_KEY_INVALID for a key that is %s', async (_what, bad) => {
    const res = await http().post('/payments').set('Idempotency-Key', bad).send({ amount: 5 });
    expect(res.status).toBe(400);
    expect(res.body).toMatchObject({ code: 'IDEMPOTENCY_KEY_INVALID' });
    expect(probe.runs).toBe(0);
  });

  it('accepts a key of exactly 255 characters', async () => {
    const res = await http().post('/payments').set('Idempotency-Key', 'k'.repeat(254) + key[0]).send({ amount: 5 });
    expect(res.status).toBe(201);
  });

  it('releases the key when the handler throws, so a retry runs', async () => {
    probe.failuresLeft = 1;
    const failed = await http().post('/payments').set('Idempotency-Key', key).send({ amount: 5 });
    expect(failed.status).toBe(400);
    expect(failed.body.code).toBe('PLANNED_FAILURE');
    const retry = await http().post('/payments').set('Idempotency-Key', key).send({ amount: 5 });
    expect(retry.status).toBe(201);
    expect(retry.headers['idempotent-replayed']).toBeUndefined();
    expect(probe.runs).toBe(2);
  });

  it('keeps users apart: the same key from two users runs twice', async () => {
    const a = await http().post('/payments').set('Idempotency-Key', key).set('x-user', 'alice').send({ amount: 5 });
    const b = await http().post('/payments').set('Idempotency-Key', key).set('x-user', 'bob').send({ amount: 5 });
    expect(a.body.run).toBe(1);
    expect(b.body.run).toBe(2);
    expect(b.headers['idempotent-replayed']).toBeUndefined();
  });

  it('uses the fingerprint without a key: key order and ignored fields do not matter, values do', async () => {
    const tag = randomUUID();
    const post = () => http().post('/fingerprinted').set('x-user', 'carol');
    const first = await post().send({ tag, a: { x: 1, y: [1, 2] }, b: 2, timestamp: 1 });
    const same = await post().send({ b: 2, timestamp: 99, a: { y: [1, 2], x: 1 }, tag });
    expect(same.headers['idempotent-replayed']).toBe('true');
    expect(same.body).toEqual(first.body);
    const other = await post().send({ tag, a: { x: 1, y: [2, 1] }, b: 2 });
    expect(other.headers['idempotent-replayed']).toBeUndefined();
    expect(probe.runs).toBe(2);
  });

  it('refuses an anonymous call without a key on a fingerprint route (anonymous callers share one namespace)', async () => {
    const res = await http().post('/fingerprinted').send({ tag: key });
    expect(res.status).toBe(400);
    expect(res.body).toMatchObject({ code: 'IDEMPOTENCY_KEY_MISSING' });
    expect(probe.runs).toBe(0);
  });

  it('answers 400 IDEMPOTENCY_PAYLOAD_UNSUPPORTED for a body nested too deep to fingerprint', async () => {
    const deep = '{"a":'.repeat(5000) + '1' + '}'.repeat(5000);
    const res = await http().post('/fingerprinted').set('x-user', 'carol').set('content-type', 'application/json').send(deep);
    expect(res.status).toBe(400);
    expect(res.body).toMatchObject({ code: 'IDEMPOTENCY_PAYLOAD_UNSUPPORTED' });
    expect(probe.runs).toBe(0);
  });

  it('fingerprints non-JSON bodies by their raw bytes', async () => {
    const xml = `<receipt><no>${key}</no></receipt>`;
    const send = (body: string) => http().post('/fingerprinted').set('x-user', 'carol').set('content-type', 'application/xml').send(body);
    // No rawBody: the guard hashes what the XML parser gave (Express: a string, Fastify: a Buffer) as bytes.
    const first = await send(xml);
    expect(first.status).toBe(201);
    const again = await send(xml);
    expect(again.headers['idempotent-replayed']).toBe('true');
    const spaced = await send(xml.replace('<no>', '<no> '));
    expect(spaced.status).toBe(201);
    expect(spaced.headers['idempotent-replayed']).toBeUndefined();
    expect(probe.runs).toBe(2);
  });

  it('replays a streamed response byte for byte, and runs its handler once', async () => {
    const raw = (req: request.Test) => req.buffer(true).parse((res, done) => {
      const chunks: Buffer[] = [];
      res.on('data', (chunk: Buffer) => chunks.push(chunk));
      res.on('end', () => done(null, Buffer.concat(chunks)));
    });
    const first = await raw(http().post('/stream').set('Idempotency-Key', key));
    expect(first.status).toBe(201);
    const second = await raw(http().post('/stream').set('Idempotency-Key', key));
    expect(second.status).toBe(201);
    expect(second.headers['idempotent-replayed']).toBe('true');
    expect(second.headers['content-type']).toBe(first.headers['content-type']);
    expect(Buffer.compare(second.body as Buffer, first.body as Buffer)).toBe(0);
    expect(probe.runs).toBe(1);
  });

  it('replays a text answer as the same text, with the key from an expression', async () => {
    const first = await http().post('/text').set('x-request-id', key);
    const again = await http().post('/text').set('x-request-id', key);
    expect(first.status).toBe(200);
    expect(again.status).toBe(200);
    expect(again.text).toBe(first.text);
    expect(again.headers['content-type']).toBe(first.headers['content-type']);
    expect(again.headers['idempotent-replayed']).toBe('true');
  });

  it('takes the key from a function', async () => {
    await http().post(`/tenants/${key}/jobs`);
    const again = await http().post(`/tenants/${key}/jobs`);
    expect(again.headers['idempotent-replayed']).toBe('true');
    expect(probe.runs).toBe(1);
  });

  // An adversarial helper (session 19): a key function reading `body.ref` gave null, an array or
  // an object as the client sent it: a TypeError (500), or every object the one key
  // `[object Object]` (the second object got 422). Null is no key; an array or an object is no
  // one key (400 IDEMPOTENCY_KEY_INVALID), as in a key expression.
  it("takes a key function's number as its text, null as no key, and refuses an array or an object (400, never a 500)", async () => {
    const refs: [unknown, string][] = [
      [null, 'IDEMPOTENCY_KEY_MISSING'],
      [Array.from({ length: 300 }, (_, i) => i), 'IDEMPOTENCY_KEY_INVALID'],
      [{ a: 1 }, 'IDEMPOTENCY_KEY_INVALID'],
      [{ b: 2 }, 'IDEMPOTENCY_KEY_INVALID'],
    ];
    for (const [ref, code] of refs) {
      const answer = await http().post('/refs').send({ ref });
      expect({ status: answer.status, code: answer.body.code }).toEqual({ status: 400, code });
    }
    expect(probe.runs).toBe(0);
    const ref = Date.now() * 1000 + Math.floor(Math.random() * 1000);
    expect((await http().post('/refs').send({ ref })).status).toBe(201);
    const again = await http().post('/refs').send({ ref });
    expect(again.headers['idempotent-replayed']).toBe('true');
    expect(probe.runs).toBe(1);
  });

  // An adversarial helper (session 19): an async key function answered every call 400
  // IDEMPOTENCY_KEY_MISSING, blaming the client, with nothing logged.
  it('answers 500, not a 400 that blames the client, when the key function returns a promise or an Observable; the handler does not run', async () => {
    for (const path of ['/async-key', '/observable-key']) {
      const answer = await http().post(path).send({});
      expect(answer.status).toBe(500);
    }
    expect(probe.runs).toBe(0);
  });
});
