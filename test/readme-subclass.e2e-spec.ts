// The library README's subclass example (a JwtIdempotencyInterceptor reading the subject of a
// bearer token the app's guard verified), run as a user copies it: its three snippets written
// out and imported, a guarded controller beside them. Copied as it was, it read the scheme only
// as "Bearer " and returned undefined otherwise, which keys the call as anonymous: with the
// scheme sent as "bearer" (RFC 9110 and passport-jwt take any case), bob got alice's answer
// under the same key and his handler never ran (an adversarial helper: 20 of 20 keys).
import { afterAll, beforeAll, describe, expect, it } from '@jest/globals';
import { Body, Controller, Module, Post, type INestApplication, type Type } from '@nestjs/common';
import { NestFactory } from '@nestjs/core';
import { ExpressAdapter } from '@nestjs/platform-express';
import { randomUUID } from 'node:crypto';
import { mkdirSync, readFileSync, writeFileSync } from 'node:fs';
import { join } from 'node:path';
import { fileURLToPath, pathToFileURL } from 'node:url';
import { NoRepeatSubmit } from '../libs/idempotency/src/index.js';
import { REDIS_URL } from './support/services.js';

const ROOT = fileURLToPath(new URL('..', import.meta.url));
const OUT = join(ROOT, '.test-logs/readme-subclass');

/** Writes the README's `subclass/*` snippets to `OUT` and returns the path of each by file name. */
function writeSubclassSnippets(): Map<string, string> {
  const lines = readFileSync(join(ROOT, 'libs/idempotency/README.md'), 'utf8').split('\n');
  const written = new Map<string, string>();
  mkdirSync(OUT, { recursive: true });
  lines.forEach((text, index) => {
    const marker = /^<!-- compiled: subclass\/([\w.-]+\.ts) -->$/.exec(text.trim());
    if (!marker) return;
    const end = lines.findIndex((line, at) => at > index + 1 && line.trim() === '```');
    const path = join(OUT, marker[1]!);
    writeFileSync(path, lines.slice(index + 2, end).join('\n') + '\n');
    written.set(marker[1]!, path);
  });
  return written;
}

const runs: string[] = [];

@Controller('transfers')
class TransfersController {
  @Post()
  @NoRepeatSubmit()
  create(@Body() body: { to: string }) {
    const run = randomUUID();
    runs.push(run);
    return { to: body.to, run };
  }
}

/** A token whose signature the app's guard would check (not this test's concern). */
const token = (claims: object) => `h.${Buffer.from(JSON.stringify(claims)).toString('base64url')}.sig`;

describe("the README's subclass example, copied", () => {
  let app: INestApplication;
  let url: string;

  beforeAll(async () => {
    const files = writeSubclassSnippets();
    expect([...files.keys()].sort()).toEqual(['app.module.ts', 'auth.module.ts', 'jwt-idempotency.interceptor.ts']);
    process.env.REDIS_URL ??= REDIS_URL;
    const { AppModule } = (await import(pathToFileURL(files.get('app.module.ts')!).href)) as { AppModule: Type };
    @Module({ imports: [AppModule], controllers: [TransfersController] })
    class TestModule {}
    app = await NestFactory.create(TestModule, new ExpressAdapter(), { logger: false });
    await app.listen(0, '127.0.0.1');
    url = (await app.getUrl()).replace('[::1]', '127.0.0.1');
  });
  afterAll(async () => app?.close());

  const post = (authorization: string, key: string) =>
    fetch(`${url}/transfers`, {
      method: 'POST',
      headers: { authorization, 'idempotency-key': key, 'content-type': 'application/json' },
      body: JSON.stringify({ to: 'carol' }),
    });

  it('keys two users apart under one key, whatever the case of the scheme', async () => {
    for (const scheme of ['Bearer', 'bearer', 'BEARER']) {
      const key = randomUUID();
      const alice = await post(`${scheme} ${token({ sub: 'alice' })}`, key);
      const bob = await post(`${scheme}  ${token({ sub: 'bob' })}`, key);
      expect([alice.status, bob.status, bob.headers.get('idempotent-replayed')]).toEqual([201, 201, null]);
      expect(((await bob.json()) as { run: string }).run).not.toBe(((await alice.json()) as { run: string }).run);
    }
  });

  it('refuses credentials it cannot read (no sub), rather than key them with every anonymous caller', async () => {
    const before = runs.length;
    const answer = await post(`Bearer ${token({ name: 'mallory' })}`, randomUUID());
    expect(answer.status).toBe(401);
    expect(runs.length).toBe(before);
  });
});
