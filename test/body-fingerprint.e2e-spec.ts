import { afterAll, beforeAll, beforeEach, describe, expect, it } from '@jest/globals';
import type { ExecutionContext, INestApplication } from '@nestjs/common';
import { createHash, randomUUID } from 'node:crypto';
import request from 'supertest';
import type { IdempotencyModuleOptions } from '../libs/idempotency/src/index.js';
import { createGuardTestApp, Probe, type AdapterName } from './support/guard-test.app.js';
import { REDIS_URL } from './support/services.js';

const XML = '<receipt><no>R-1</no>\n  <note>café ☕ 😀</note></receipt>';
const sha256 = (bytes: string | Buffer) => createHash('sha256').update(bytes).digest('hex');

/** Bodies as sent, byte for byte; each has its parser in the test app on both adapters. */
const BODIES: [what: string, contentType: string, body: string | Buffer][] = [
  ['XML', 'application/xml', XML],
  ['XML with a charset', 'text/xml; charset=utf-8', XML],
  ['text/plain', 'text/plain', 'pay  R-1\r\nnote: café'],
  ['JSON', 'application/json', '{ "orderNo": "R-1", "note": "café", "items": [2, 1] }'],
  ['a Buffer body (octet-stream)', 'application/octet-stream', Buffer.from([0x00, 0xff, 0xfe, 0x41, 0x0a, 0xc3])],
];
const changed = (body: string | Buffer) => (typeof body === 'string' ? body.replace('R-1', 'R-2') : Buffer.concat([body, Buffer.from([0])]));

/**
 * Apps no longer need `rawBody: true`: the guard fingerprints what the body parser gave the
 * route. Two apps share one Redis key prefix, one created with `rawBody` (as the README asked
 * before) and one without (as it says now), so a record one writes is what the other finds: a
 * retry across the upgrade.
 */
describe.each<AdapterName>(['express', 'fastify'])('fingerprints with and without rawBody (%s)', (adapter) => {
  let withRaw: INestApplication;
  let without: INestApplication;
  let key: string;
  const prefix = `body-fp-${randomUUID()}`;
  const post = (app: INestApplication, path: string, contentType: string, body: string | Buffer) =>
    request(app.getHttpServer()).post(path).set('x-user', 'dana').set('idempotency-key', key).set('content-type', contentType).send(body);
  const runs = () => [withRaw.get(Probe).runs, without.get(Probe).runs];

  beforeAll(async () => {
    const options: IdempotencyModuleOptions = {
      store: { redis: REDIS_URL },
      keyPrefix: prefix,
      getUser: (ctx: ExecutionContext) => ctx.switchToHttp().getRequest<{ headers: Record<string, string> }>().headers['x-user'],
    };
    withRaw = await createGuardTestApp(adapter, options, { rawBody: true });
    without = await createGuardTestApp(adapter, options);
  });
  afterAll(async () => {
    await withRaw?.close();
    await without?.close();
  });
  beforeEach(() => {
    key = randomUUID();
    withRaw.get(Probe).runs = 0;
    without.get(Probe).runs = 0;
  });

  it.each(BODIES)('finds the record of %s written with rawBody from an app without it (the same bytes, one request)', async (_what, contentType, body) => {
    const first = await post(withRaw, '/payments', contentType, body);
    expect(first.status).toBe(201);
    const retry = await post(without, '/payments', contentType, body);
    expect([retry.status, retry.headers['idempotent-replayed']]).toEqual([201, 'true']);
    expect(retry.text).toBe(first.text);
    const other = await post(without, '/payments', contentType, changed(body));
    expect([other.status, other.body.code]).toEqual([422, 'IDEMPOTENCY_KEY_REUSED']);
    expect(runs()).toEqual([1, 0]);
  });

  it.each(BODIES)('and the other way round, with the fingerprint as the key (%s)', async (_what, contentType, body) => {
    const send = (app: INestApplication, bytes: string | Buffer) =>
      request(app.getHttpServer()).post('/fingerprinted').set('x-user', `fp-${key}`).set('content-type', contentType).send(bytes);
    expect((await send(without, body)).status).toBe(201);
    expect((await send(withRaw, body)).headers['idempotent-replayed']).toBe('true');
    expect((await send(withRaw, changed(body))).headers['idempotent-replayed']).toBeUndefined();
    expect(runs()).toEqual([1, 1]);
  });

  it('fingerprints a form by its fields without rawBody, by its bytes with it: the documented change across the upgrade', async () => {
    const form = 'b=2&a=caf%C3%A9';
    expect((await post(withRaw, '/payments', 'application/x-www-form-urlencoded', form)).status).toBe(201);
    const across = await post(without, '/payments', 'application/x-www-form-urlencoded', form);
    expect([across.status, across.body.code]).toEqual([422, 'IDEMPOTENCY_KEY_REUSED']);
    key = randomUUID();
    expect((await post(without, '/payments', 'application/x-www-form-urlencoded', form)).status).toBe(201);
    const sameFields = await post(without, '/payments', 'application/x-www-form-urlencoded', 'a=caf%C3%A9&b=2');
    expect([sameFields.status, sameFields.headers['idempotent-replayed']]).toEqual([201, 'true']);
    expect(runs()).toEqual([1, 1]);
  });

  it('refuses a body no parser read rather than fingerprint it as no body (Fastify refuses the type itself)', async () => {
    const csv = await post(without, '/payments', 'text/csv', 'a,b\n1,2\n');
    if (adapter === 'express') {
      expect([csv.status, csv.body.code]).toEqual([400, 'IDEMPOTENCY_PAYLOAD_UNSUPPORTED']);
      expect(csv.body.message).toContain(`app.useBodyParser('raw', { type: ['text/csv'] })`);
    } else {
      expect(csv.status).toBe(415);
    }
    const other = await post(without, '/payments', 'text/csv', 'a,b\n3,4\n');
    expect(other.status).toBe(csv.status);
    const empty = await post(without, '/payments', 'text/csv', '');
    expect(empty.status).toBe(adapter === 'express' ? 201 : 415);
    expect(runs()).toEqual([0, adapter === 'express' ? 1 : 0]);
  });

  it('checks a digest over a raw parser\'s Buffer without rawBody; a text or JSON body needs rawBody (415 without)', async () => {
    const digest = (app: INestApplication, contentType: string, body: string | Buffer) =>
      request(app.getHttpServer()).post('/digest').set('content-type', contentType).set('x-content-hash', sha256(body)).send(body);
    const bytes = Buffer.from([0x00, 0xff, 0x41]);
    for (const app of [withRaw, without]) {
      const res = await digest(app, 'application/octet-stream', bytes);
      expect([res.status, res.body.contentHash]).toEqual([200, sha256(bytes)]);
    }
    // Fastify's XML parser hands the route a Buffer; Express's text parser a string.
    const xml = await digest(without, 'application/xml', XML);
    expect([xml.status, xml.body.contentHash ?? xml.body.code]).toEqual(adapter === 'fastify' ? [200, sha256(XML)] : [415, 'CONTENT_HASH_UNAVAILABLE']);
    expect((await digest(withRaw, 'application/xml', XML)).body.contentHash).toBe(sha256(XML));
    const json = '{"b":1, "a":2}';
    expect((await digest(without, 'application/json', json)).body.code).toBe('CONTENT_HASH_UNAVAILABLE');
    expect((await digest(withRaw, 'application/json', json)).body.contentHash).toBe(sha256(json));
  });
});
