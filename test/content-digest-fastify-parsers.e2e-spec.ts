// The README's advice for Fastify apps that check JSON digests and take raw XML: with
// @nestjs/platform-fastify 11, `app.useBodyParser(...)` marked the app's parsers as registered,
// so Nest never added its JSON parser that keeps `rawBody`, and every JSON `@ContentDigest`
// route answered 415 CONTENT_HASH_UNAVAILABLE (an adversarial helper, Nest 11.2). An XML parser
// registered on the Fastify instance itself leaves Nest's JSON parser, and `rawBody`, in place.
// This repository runs Nest 12, whose useBodyParser keeps it: both are checked here.
import { afterEach, describe, expect, it } from '@jest/globals';
import { Controller, Module, Post } from '@nestjs/common';
import { NestFactory } from '@nestjs/core';
import { FastifyAdapter, type NestFastifyApplication } from '@nestjs/platform-fastify';
import { createHash } from 'node:crypto';
import request from 'supertest';
import { ContentDigest, ContentHash } from '../libs/idempotency/src/index.js';

@Controller('digest')
class DigestController {
  @Post()
  @ContentDigest()
  digest(@ContentHash() contentHash: string) {
    return { contentHash };
  }
}

@Module({ controllers: [DigestController] })
class DigestModule {}

type ParserSetup = (app: NestFastifyApplication) => void;

const XML = '<order><no>A1</no></order>';
const JSON_BODY = '{"orderNo":"A1","amount":5}';
const hex = (text: string) => createHash('sha256').update(text).digest('hex');

describe('@ContentDigest on Fastify with rawBody and a raw XML parser', () => {
  let app: NestFastifyApplication | undefined;
  afterEach(async () => app?.close());

  const start = async (setup: ParserSetup) => {
    app = await NestFactory.create<NestFastifyApplication>(DigestModule, new FastifyAdapter(), { rawBody: true, logger: false });
    setup(app);
    await app.init();
    await app.getHttpAdapter().getInstance().ready();
    return app;
  };
  const post = (type: string, body: string) =>
    request(app!.getHttpServer()).post('/digest').set('content-type', type).send(body);

  it("checks JSON when the XML parser comes from Nest's useBodyParser (Nest 12)", async () => {
    await start((nest) => nest.useBodyParser(['application/xml']));
    const json = await post('application/json', JSON_BODY);
    expect([json.status, json.body.contentHash]).toEqual([201, hex(JSON_BODY)]);
  });

  it('checks JSON and XML alike when the XML parser is registered on the Fastify instance', async () => {
    await start((nest) =>
      nest
        .getHttpAdapter()
        .getInstance()
        .addContentTypeParser(['application/xml', 'text/xml'], { parseAs: 'buffer' }, (_request, body, done) => done(null, body)),
    );
    const json = await post('application/json', JSON_BODY);
    expect([json.status, json.body.contentHash]).toEqual([201, hex(JSON_BODY)]);
    const xml = await post('application/xml', XML);
    expect([xml.status, xml.body.contentHash]).toEqual([201, hex(XML)]);
  });
});
