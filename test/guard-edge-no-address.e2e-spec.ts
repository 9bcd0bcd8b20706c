// `anonymous: 'address'` on requests that carry no usable client address: a unix socket (as
// behind a local reverse proxy that speaks to the app over one), or a trusted proxy's
// `X-Forwarded-For: unknown` (Squid's `forwarded_for off`) or `_hidden` (RFC 7239's obfuscated
// node). Adversarial helpers (session 19): every such caller was keyed by one shared address
// (`ip:unknown`, `ip:unknown` again, `ip:_hidden`), so a second caller who sent the same request
// got the first caller's answer as a replay. With no address, a call is keyed as under
// `anonymous: 'client-key'`: only a key the caller chose keys it. And one address written two
// ways (IPv6 in full or short, upper or lower case, IPv4-mapped) is one caller.
import { afterAll, beforeAll, describe, expect, it } from '@jest/globals';
import { Body, Controller, Module, Post, type INestApplication } from '@nestjs/common';
import { NestFactory } from '@nestjs/core';
import { ExpressAdapter } from '@nestjs/platform-express';
import { FastifyAdapter } from '@nestjs/platform-fastify';
import { randomUUID } from 'node:crypto';
import { rm } from 'node:fs/promises';
import { request, type IncomingHttpHeaders } from 'node:http';
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

/** POSTs `body` over the unix socket at `socketPath` (or to `url`). */
function post(
  target: string,
  body: unknown,
  headers: Record<string, string> = {},
): Promise<{ status: number; text: string; replayed: boolean; headers: IncomingHttpHeaders }> {
  return new Promise((resolve, reject) => {
    const where = target.startsWith('http') ? { host: new URL(target).hostname, port: new URL(target).port } : { socketPath: target };
    const req = request({ ...where, path: '/profile', method: 'POST', agent: false, headers: { 'content-type': 'application/json', ...headers } }, (res) => {
      const chunks: Buffer[] = [];
      res.on('data', (chunk: Buffer) => chunks.push(chunk));
      res.on('end', () =>
        resolve({
          status: res.statusCode ?? 0,
          text: Buffer.concat(chunks).toString('utf8'),
          replayed: res.headers['idempotent-replayed'] === 'true',
          headers: res.headers,
        }),
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

describe.each<Adapter>(['express', 'fastify'])("anonymous: 'address' behind a trusted proxy (%s)", (adapter) => {
  let app: INestApplication;
  let url: string;

  beforeAll(async () => {
    @Module({ imports: [IdempotencyModule.forRoot({ store: new MemoryIdempotencyStore(), anonymous: 'address' })], controllers: [ProfileController] })
    class ProxiedModule {}
    app =
      adapter === 'fastify'
        ? await NestFactory.create(ProxiedModule, new FastifyAdapter({ trustProxy: true }), { logger: false })
        : await NestFactory.create(ProxiedModule, new ExpressAdapter(), { logger: false });
    if (adapter === 'express') (app.getHttpAdapter().getInstance() as { set(name: string, value: unknown): void }).set('trust proxy', true);
    await app.listen(0, '127.0.0.1');
    url = `http://127.0.0.1:${(app.getHttpServer().address() as { port: number }).port}`;
  });
  afterAll(async () => app?.close());

  it.each(['unknown', '_hidden'])('keys no two callers the proxy names %p as one', async (name) => {
    runs = 0;
    const first = await post(url, { caller: 'x' }, { 'x-forwarded-for': name });
    const second = await post(url, { caller: 'x' }, { 'x-forwarded-for': name });
    expect([first.replayed, second.replayed]).toEqual([false, false]);
    expect(runs).toBe(2);
  });

  // Some load balancers write the client's port too: an address with a port is still that address.
  it.each([
    ['2001:db8::1', '2001:DB8:0:0:0:0:0:1'],
    ['::ffff:198.51.100.7', '198.51.100.7'],
    ['10.0.0.1:1234', '10.0.0.1:1234'],
    ['[2001:db8::1]:80', '2001:db8::1'],
  ])('takes %p and %p for one caller', async (one, other) => {
    runs = 0;
    const body = { caller: randomUUID() };
    await post(url, body, { 'x-forwarded-for': one });
    const again = await post(url, body, { 'x-forwarded-for': other });
    expect(again.replayed).toBe(true);
    expect(runs).toBe(1);
  });
});
