import { afterAll, beforeAll, describe, expect, it } from '@jest/globals';
import type { INestApplication } from '@nestjs/common';
import { randomUUID } from 'node:crypto';
import request from 'supertest';
import { createDemoApp, type HttpAdapterName } from '../apps/demo/src/demo-app.factory.js';
import { DATABASE_URL } from './support/services.js';

const codesOf = (response: any): string[] => [...response.content['application/json'].schema.properties.code.enum].sort();

describe.each<HttpAdapterName>(['express', 'fastify'])('the demo OpenAPI document (%s)', (adapter) => {
  let app: INestApplication;
  beforeAll(async () => {
    try {
      app = await createDemoApp({ adapter, databaseUrl: DATABASE_URL, keyPrefix: `openapi-${randomUUID()}`, logger: ['error'] });
    } catch (error) {
      throw new Error(`Could not start the demo app against PostgreSQL at ${DATABASE_URL}`, { cause: error });
    }
  });
  afterAll(async () => app?.close());

  it("keeps POST /orders' own 201 beside the guard's answers, with every code per status", async () => {
    const docs = await request(app.getHttpServer()).get('/docs-json').expect(200);
    const responses = docs.body.paths['/orders'].post.responses;
    expect(responses['201']).toBeDefined();
    expect(codesOf(responses['400'])).toEqual(['IDEMPOTENCY_KEY_INVALID', 'IDEMPOTENCY_KEY_MISSING', 'IDEMPOTENCY_PAYLOAD_UNSUPPORTED']);
    expect(codesOf(responses['409'])).toEqual(['IDEMPOTENCY_IN_PROGRESS', 'IDEMPOTENCY_RESPONSE_NOT_REPLAYABLE']);
    expect(responses['409'].headers).toHaveProperty('Retry-After');
    expect(codesOf(responses['422'])).toEqual(['IDEMPOTENCY_KEY_REUSED']);
    expect(codesOf(responses['500'])).toEqual(['IDEMPOTENCY_USER_UNRESOLVED']);
    // The key is #body.orderNo, not the header.
    expect(docs.body.paths['/orders'].post.parameters ?? []).not.toContainEqual(expect.objectContaining({ name: 'Idempotency-Key' }));
    // Unguarded routes keep Nest swagger's defaults.
    expect(docs.body.paths['/orders/{orderNo}/cancel'].post.responses).toEqual({ '200': { description: '' } });
  });

  it("documents POST /uploads/xml's @ContentDigest answers beside its own 201", async () => {
    const docs = await request(app.getHttpServer()).get('/docs-json').expect(200);
    const responses = docs.body.paths['/uploads/xml'].post.responses;
    // Before: only the 201; the README asked for @ApiResponse()s written by hand.
    expect(Object.keys(responses).sort()).toEqual(['201', '400', '415']);
    expect(codesOf(responses['400'])).toEqual(['CONTENT_HASH_INVALID', 'CONTENT_HASH_MISMATCH']);
    expect(codesOf(responses['415'])).toEqual(['CONTENT_HASH_ENCODING_UNSUPPORTED', 'CONTENT_HASH_UNAVAILABLE']);
  });
});
