// The fingerprint covers the query as its parser gave it. An adversarial helper: on Express,
// whose default parser (Node's querystring) turns each escape that is not UTF-8 into U+FFFD,
// `?amount=%E9` and `?amount=%E8` under one key were replayed (a 422 was due), and on a
// fingerprint route one ran for the other; and the 1,001st parameter on was dropped, so two
// queries differing there were one. Where the parser may have lost part of the query, the query
// as sent counts too.
import { afterAll, beforeAll, describe, expect, it } from '@jest/globals';
import { Controller, Post, Query } from '@nestjs/common';
import { randomUUID } from 'node:crypto';
import { NoRepeatSubmit } from 'nestjs-idempotency';
import { makeApp, send, type EdgeApp } from './support/edge-app.js';

let runs = 0;

@Controller('q')
class QueryController {
  @Post('keyed')
  @NoRepeatSubmit()
  keyed(@Query() query: unknown) {
    return { run: ++runs, query };
  }

  @Post('fingerprint')
  @NoRepeatSubmit({ useRequestFingerprint: true })
  fingerprint(@Query() query: unknown) {
    return { run: ++runs, query };
  }
}

const many = Array.from({ length: 1000 }, (_, i) => `k${i}=1`).join('&');

describe.each(['express', 'fastify'] as const)('queries a parser may have lost part of (%s)', (adapter) => {
  let app: EdgeApp;
  const post = (path: string, key?: string) => send(app.url, path, { key, headers: { 'x-user': 'u' } });
  const codeOf = (answer: { text: string }) => (JSON.parse(answer.text) as { code?: string }).code;

  beforeAll(async () => {
    app = await makeApp(adapter, [QueryController], { getUser: (ctx) => ctx.switchToHttp().getRequest().headers['x-user'] });
  });
  afterAll(async () => {
    await app?.close();
  });

  it.each([
    ['an escape that is not UTF-8', '?amount=%E9', '?amount=%E8'],
    ['a lone surrogate, escaped', '?a=%ED%A0%80', '?a=%ED%A0%81'],
    ['a name that is not UTF-8', '?%FF=1', '?%FE=1'],
    ['a real U+FFFD against a byte that is not UTF-8', '?a=%EF%BF%BD', '?a=%FF'],
    ['the 1,001st parameter', `?${many}&amount=1`, `?${many}&amount=999`],
    ['the 1,001st parameter after 1,000 empty ones', `?${'&'.repeat(1000)}amount=1`, `?${'&'.repeat(1000)}amount=999`],
  ])('%s: one key and the other query is 422; on a fingerprint route each runs', async (_what, first, second) => {
    const key = randomUUID();
    expect((await post(`/q/keyed${first}`, key)).status).toBe(201);
    const reused = await post(`/q/keyed${second}`, key);
    expect({ status: reused.status, code: codeOf(reused) }).toEqual({ status: 422, code: 'IDEMPOTENCY_KEY_REUSED' });
    const tag = `&t=${randomUUID()}`;
    const before = runs;
    expect((await post(`/q/fingerprint${first}${tag}`)).headers['idempotent-replayed']).toBeUndefined();
    expect((await post(`/q/fingerprint${second}${tag}`)).headers['idempotent-replayed']).toBeUndefined();
    expect(runs).toBe(before + 2);
  });

  it.each([
    ['the same bytes', '?amount=%E9', '?amount=%E9'],
    ['parameters in another order', '?a=1&b=2', '?b=2&a=1'],
    ['a letter escaped or not', '?a=%41', '?a=A'],
    ['a bad escape, parameters in another order', '?a=%E9&b=1', '?b=1&a=%E9'],
    ['a bad escape, a trailing &', '?a=%E9', '?a=%E9&'],
    // Fastify's parser keeps an escape it cannot decode as sent, so its case counts there.
    ...(adapter === 'express' ? [['a bad escape in lower case', '?a=%E9', '?a=%e9']] : []),
  ])('%s: still one request (a replay)', async (_what, first, second) => {
    const key = randomUUID();
    expect((await post(`/q/keyed${first}`, key)).status).toBe(201);
    expect((await post(`/q/keyed${second}`, key)).headers['idempotent-replayed']).toBe('true');
  });
});
