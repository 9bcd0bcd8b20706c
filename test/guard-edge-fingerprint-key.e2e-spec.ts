// A route keyed by the request's fingerprint when the caller sends no key of its own
// (`useRequestFingerprint`): a client key equal to a request's fingerprint landed on that
// request's record (an adversarial helper, helper-195). The fingerprint is no secret (a SHA-256 of
// the method, the path and the body, the same for every user): a caller who sent another
// payload under it had the keyless request refused 422 IDEMPOTENCY_KEY_REUSED though it carried
// no key, and in the other order got the keyless request's answer as a replay. A fingerprint's
// record is now apart from every client key's.
import { afterAll, beforeAll, describe, expect, it } from '@jest/globals';
import { Body, Controller, Post, type ExecutionContext } from '@nestjs/common';
import { Redis } from 'ioredis';
import { randomUUID } from 'node:crypto';
import { NoRepeatSubmit } from '../libs/idempotency/src/index.js';
import { codeOf, makeApp, replayed, send, type Adapter, type EdgeApp } from './support/edge-app.js';
import { REDIS_URL } from './support/services.js';

const runs: string[] = [];

@Controller()
class TransfersController {
  @Post('transfers')
  @NoRepeatSubmit({ useRequestFingerprint: true })
  transfer(@Body() body: { amount: number; to: string }) {
    runs.push(`${body.to} ${body.amount}`);
    return { sent: body.amount, to: body.to };
  }
}

const userOf = (ctx: ExecutionContext) => ctx.switchToHttp().getRequest<{ headers: Record<string, string> }>().headers['x-user'];

describe.each<Adapter>(['express', 'fastify'])('a client key equal to a request fingerprint (%s)', (adapter) => {
  const keyPrefix = `fpkey-${randomUUID()}`;
  let app: EdgeApp;
  let redis: Redis;

  beforeAll(async () => {
    app = await makeApp(adapter, [TransfersController], { store: { redis: REDIS_URL }, keyPrefix, getUser: userOf });
    redis = new Redis(REDIS_URL);
  });
  afterAll(async () => {
    await app?.close();
    await redis?.quit();
  });

  /** The fingerprint of `body` sent without a key, read from the record it left (users share fingerprints). */
  async function fingerprintOf(body: object): Promise<string> {
    const user = randomUUID();
    const first = await send(app.url, '/transfers', { headers: { 'x-user': user }, body });
    expect(first.status).toBe(201);
    const [storageKey] = await redis.keys(`${keyPrefix}:${user}:*`);
    return storageKey!.slice(storageKey!.lastIndexOf(':') + 1).replace(/^fp=/, '');
  }

  it('a keyless request is not refused 422 because a key equal to its fingerprint was used with another payload', async () => {
    const to = randomUUID();
    const payload = { amount: 10, to };
    const fingerprint = await fingerprintOf(payload);
    const user = randomUUID();
    const other = await send(app.url, '/transfers', { key: fingerprint, headers: { 'x-user': user }, body: { amount: 99_999, to } });
    const keyless = await send(app.url, '/transfers', { headers: { 'x-user': user }, body: payload });
    // Observed before: 422 IDEMPOTENCY_KEY_REUSED, and the transfer of 10 never ran for this user.
    expect([other.status, keyless.status, codeOf(keyless) ?? null, replayed(keyless)]).toEqual([201, 201, null, false]);
    expect(runs.filter((run) => run.startsWith(to))).toEqual([`${to} 10`, `${to} 99999`, `${to} 10`]);
  });

  it('a request keyed with a fingerprint runs: it gets no keyless request\'s answer', async () => {
    const to = randomUUID();
    const user = randomUUID();
    const payload = { amount: 5, to };
    const keyless = await send(app.url, '/transfers', { headers: { 'x-user': user }, body: payload });
    const [storageKey] = await redis.keys(`${keyPrefix}:${user}:*`);
    const fingerprint = storageKey!.slice(storageKey!.lastIndexOf(':') + 1).replace(/^fp=/, '');
    const keyed = await send(app.url, '/transfers', { key: fingerprint, headers: { 'x-user': user }, body: { amount: 7, to } });
    // Observed before: 200 { sent: 5 } with Idempotent-Replayed: true; the transfer of 7 never ran.
    expect([keyless.status, keyed.status, replayed(keyed), JSON.parse(keyed.text)]).toEqual([201, 201, false, { sent: 7, to }]);
    // Keyless duplicates still replay the keyless answer, keyed duplicates the keyed one.
    const [again, keyedAgain] = await Promise.all([
      send(app.url, '/transfers', { headers: { 'x-user': user }, body: payload }),
      send(app.url, '/transfers', { key: fingerprint, headers: { 'x-user': user }, body: { amount: 7, to } }),
    ]);
    expect([replayed(again), JSON.parse(again.text).sent, replayed(keyedAgain), JSON.parse(keyedAgain.text).sent]).toEqual([true, 5, true, 7]);
    expect(runs.filter((run) => run.startsWith(to))).toEqual([`${to} 5`, `${to} 7`]);
  });
});
