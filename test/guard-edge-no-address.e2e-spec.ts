// `anonymous: 'address'` on a server whose requests carry no client address (a unix socket, as
// behind a local reverse proxy that speaks to the app over one). An adversarial helper (session
// 19): every anonymous caller was keyed `ip:unknown`, one shared namespace keyed also by the
// fingerprint, so a second caller who sent the same request got the first caller's answer as a
// replay. With no address, a call is keyed as under `anonymous: 'client-key'`: only a key the
// caller chose keys it, and a fingerprint route refuses it without one.
import { afterAll, beforeAll, describe, expect, it } from '@jest/globals';
import { Body, Controller, Module, Post, type INestApplication } from '@nestjs/common';
import { NestFactory } from '@nestjs/core';
import { ExpressAdapter } from '@nestjs/platform-express';
import { FastifyAdapter } from '@nestjs/platform-fastify';
import { randomUUID } from 'node:crypto';
import { rm } from 'node:fs/promises';
import { request } from 'node:http';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { IdempotencyModule, MemoryIdempotencyStore, NoRepeatSubmit } from '../libs/idempotency/src/index.js';
import type { Adapter } from './support/edge-app.js';

let runs = 0;

@Controller()
class ProfileController {
  /** Keyed by the request itself: who asks is the only thing that tells two callers apart. */
  @Post('profile')
  @NoRepeatSubmit({ useRequestFingerprint: true, required: false })
  profile(@Body() body: { caller: string }) {
    runs++;
    return { for: body.caller === 'x' ? `caller ${runs}` : body.caller, run: runs };
  }
}

/** POSTs `body` over the unix socket at `socketPath`. */
function post(socketPath: string, body: unknown, headers: Record<string, string> = {}): Promise<{ status: number; text: string; replayed: boolean }> {
  return new Promise((resolve, reject) => {
    const req = request({ socketPath, path: '/profile', method: 'POST', headers: { 'content-type': 'application/json', ...headers } }, (res) => {
      const chunks: Buffer[] = [];
      res.on('data', (chunk: Buffer) => chunks.push(chunk));
      res.on('end', () =>
        resolve({ status: res.statusCode ?? 0, text: Buffer.concat(chunks).toString('utf8'), replayed: res.headers['idempotent-replayed'] === 'true' }),
      );
    });
    req.on('error', reject);
    req.end(JSON.stringify(body));
  });
}

describe.each<Adapter>(['express', 'fastify'])("anonymous: 'address' on requests with no client address (a unix socket, %s)", (adapter) => {
  const socketPath = join(tmpdir(), `idempotency-no-address-${randomUUID().slice(0, 8)}.sock`);
  let app: INestApplication;

  beforeAll(async () => {
    @Module({ imports: [IdempotencyModule.forRoot({ store: new MemoryIdempotencyStore(), anonymous: 'address' })], controllers: [ProfileController] })
    class NoAddressModule {}
    app = await NestFactory.create(NoAddressModule, adapter === 'fastify' ? new FastifyAdapter() : new ExpressAdapter(), { logger: false });
    await app.listen(socketPath);
  });
  afterAll(async () => {
    await app?.close();
    await rm(socketPath, { force: true });
  });

  it('never answers one caller with another\'s answer: without a key of its own, the call is not keyed by the request alone', async () => {
    runs = 0;
    const first = await post(socketPath, { caller: 'x' });
    const second = await post(socketPath, { caller: 'x' });
    expect([first.replayed, second.replayed]).toEqual([false, false]);
    expect(runs).toBe(2);
  });

  it('still guards a caller who sends a key of its own', async () => {
    runs = 0;
    const key = randomUUID();
    await post(socketPath, { caller: 'x' }, { 'idempotency-key': key });
    const again = await post(socketPath, { caller: 'x' }, { 'idempotency-key': key });
    expect(again.replayed).toBe(true);
    expect(runs).toBe(1);
  });
});
