import { afterAll, beforeAll, describe, expect, it } from '@jest/globals';
import type { INestApplication } from '@nestjs/common';
import { createHash, randomUUID } from 'node:crypto';
import { brotliCompressSync, gzipSync } from 'node:zlib';
import request from 'supertest';
import { createGuardTestApp, type AdapterName } from './support/guard-test.app.js';
import { REDIS_URL } from './support/services.js';

const XML = '<order><no>A1</no></order>';
const sha256 = (bytes: string | Buffer) => createHash('sha256').update(bytes).digest();
/** RFC 9530 `Content-Digest` of the bytes: `sha-256=:<base64>:`. */
const contentDigest = (bytes: string | Buffer) => `sha-256=:${sha256(bytes).toString('base64')}:`;

/**
 * `@ContentDigest()` on the guard test app's `POST /digest`, with application/octet-stream (a
 * raw parser's Buffer on both adapters), in apps with and without `rawBody`. A request must get
 * the same answer on Express and on Fastify.
 */
describe.each<AdapterName>(['express', 'fastify'])('@ContentDigest over the bytes as sent (%s)', (adapter) => {
  const apps: INestApplication[] = [];
  const post = (app: INestApplication, body: Buffer | string, headers: Record<string, string | string[]>) =>
    request(app.getHttpServer()).post('/digest').set('content-type', 'application/octet-stream').set(headers).send(Buffer.from(body));

  beforeAll(async () => {
    const options = { store: { redis: REDIS_URL }, keyPrefix: `content-digest-${randomUUID()}` };
    apps.push(await createGuardTestApp(adapter, options), await createGuardTestApp(adapter, options, { rawBody: true }));
  });
  afterAll(async () => Promise.all(apps.map((app) => app.close())));

  it.each([
    ['gzip', gzipSync(XML)],
    ['br', brotliCompressSync(XML)],
  ])(
    'refuses a %s body 415 CONTENT_HASH_ENCODING_UNSUPPORTED (Accept-Encoding: identity), whichever digest it carries: Express decodes it before the guard, Fastify does not',
    async (coding, encoded) => {
      for (const app of apps) {
        for (const digest of <Record<string, string>[]>[{ 'content-digest': contentDigest(encoded) }, { 'content-digest': contentDigest(XML) }, {}]) {
          const res = await post(app, encoded, { 'content-encoding': coding, ...digest });
          expect([res.status, res.body.code, res.headers['accept-encoding']]).toEqual([415, 'CONTENT_HASH_ENCODING_UNSUPPORTED', 'identity']);
          expect(res.body.message).toContain(`Content-Encoding "${coding}"`);
        }
      }
    },
  );

  it('checks a body under Content-Encoding: identity as any other', async () => {
    for (const app of apps) {
      const res = await post(app, XML, { 'content-encoding': 'identity', 'content-digest': contentDigest(XML) });
      expect([res.status, res.body.contentHash]).toEqual([200, sha256(XML).toString('hex')]);
    }
  });

  it('reads a Content-Digest whose parameter holds a comma in a string', async () => {
    for (const app of apps) {
      const res = await post(app, XML, { 'content-digest': `${contentDigest(XML)};note="a,b"` });
      expect([res.status, res.body.contentHash]).toEqual([200, sha256(XML).toString('hex')]);
    }
  });

  it('reads two Content-Digest field lines as one dictionary (RFC 8941), refusing two sha-256 members across them', async () => {
    const sha512 = `sha-512=:${createHash('sha512').update(XML).digest('base64')}:`;
    for (const app of apps) {
      const two = await post(app, XML, { 'content-digest': [sha512, contentDigest(XML)] });
      expect([two.status, two.body.contentHash]).toEqual([200, sha256(XML).toString('hex')]);
      const twice = await post(app, XML, { 'content-digest': [contentDigest(XML), contentDigest('other')] });
      expect([twice.status, twice.body.code]).toEqual([400, 'CONTENT_HASH_INVALID']);
    }
  });
});
