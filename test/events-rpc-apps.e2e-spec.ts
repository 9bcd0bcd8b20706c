// Events of RPC messages (@MessagePattern over the Redis transport), one per
// outcome; two apps in one process (an HTTP app and a microservice, each with its own module)
// never see each other's events; keyHash is the same on two instances for one key.
import { afterAll, beforeAll, describe, expect, it } from '@jest/globals';
import { Body, Controller, Injectable, Module, Post, type INestMicroservice } from '@nestjs/common';
import { NestFactory } from '@nestjs/core';
import { ClientProxyFactory, MessagePattern, Payload, Transport, type ClientProxy, type RedisOptions } from '@nestjs/microservices';
import { createHash, randomUUID } from 'node:crypto';
import { firstValueFrom } from 'rxjs';
import { IdempotencyEvents, IdempotencyModule, NoRepeatSubmit, buildStorageKey, type IdempotencyEvent } from '../libs/idempotency/src/index.js';
import { makeApp, raw, replayed, until, type EdgeApp } from './support/edge-app.js';
import { REDIS_URL } from './support/services.js';

const RUN = randomUUID().slice(0, 8);
const PREFIX = `rv-rpc-${RUN}`;
const sha = (text: string) => createHash('sha256').update(text).digest('hex');

@Injectable()
class Runs {
  count = 0;
}

@Controller()
class RpcOrders {
  constructor(private readonly runs: Runs) {}

  @MessagePattern(`rv.orders.${RUN}`)
  @NoRepeatSubmit({ idempotentKey: '#data.messageId' })
  async create(@Payload() data: { messageId: string; fail?: boolean }) {
    this.runs.count++;
    await new Promise((resolve) => setTimeout(resolve, 80));
    if (data.fail) throw new Error('planned');
    return { ok: data.messageId.length };
  }
}

@Controller('h')
class HttpOrders {
  @Post()
  @NoRepeatSubmit()
  create(@Body() body: unknown) {
    return { created: body };
  }
}

const { hostname: host, port } = new URL(REDIS_URL);
const transport: RedisOptions = { transport: Transport.REDIS, options: { host, port: Number(port) } };
const rpcSeen: IdempotencyEvent[] = [];

@Module({
  imports: [IdempotencyModule.forRoot({ store: { redis: REDIS_URL }, keyPrefix: PREFIX, onEvent: (e) => void rpcSeen.push(e) })],
  controllers: [RpcOrders],
  providers: [Runs],
})
class RpcModule {}

describe('events of RPC messages, and two apps in one process', () => {
  let server: INestMicroservice;
  let client: ClientProxy;
  let http1: EdgeApp;
  let http2: EdgeApp;
  const httpSeen1: IdempotencyEvent[] = [];
  const httpSeen2: IdempotencyEvent[] = [];
  const subscribed: IdempotencyEvent[] = [];

  beforeAll(async () => {
    server = await NestFactory.createMicroservice(RpcModule, { ...transport, logger: false });
    await server.listen();
    client = ClientProxyFactory.create(transport);
    await client.connect();
    const httpOptions = (seen: IdempotencyEvent[]) => ({ store: { redis: REDIS_URL }, keyPrefix: PREFIX, onEvent: (e: IdempotencyEvent) => void seen.push(e) });
    http1 = await makeApp('express', [HttpOrders], httpOptions(httpSeen1), { setup: (app) => app.useLogger(false) });
    http2 = await makeApp('fastify', [HttpOrders], httpOptions(httpSeen2), { setup: (app) => app.useLogger(false) });
    http1.app.get(IdempotencyEvents).subscribe((e) => void subscribed.push(e));
  });
  afterAll(async () => {
    await client?.close();
    await server?.close();
    await http1?.close();
    await http2?.close();
  });

  const send = (data: { messageId: string; fail?: boolean }) => firstValueFrom(client.send(`rv.orders.${RUN}`, data));
  const rpcHash = (messageId: string) => sha(buildStorageKey({ prefix: PREFIX, user: { id: '' }, handler: 'RpcOrders.create', key: messageId }));
  const typesOf = (messageId: string) => rpcSeen.filter((e) => e.keyHash === rpcHash(messageId) && e.type !== 'store_call').map((e) => e.type);

  it('reports a message as acquired, completed (transport rpc, empty user), and its duplicate as replayed', async () => {
    const messageId = randomUUID();
    await send({ messageId });
    expect(await send({ messageId })).toEqual({ ok: 36 });
    expect(typesOf(messageId)).toEqual(['acquired', 'completed', 'replayed']);
    for (const e of rpcSeen.filter((x) => x.keyHash === rpcHash(messageId))) expect(e).toMatchObject({ transport: 'rpc', user: '', handler: 'RpcOrders.create' });
    expect(rpcSeen.find((e) => e.keyHash === rpcHash(messageId) && e.type === 'completed')).toMatchObject({ statusCode: 0 });
    expect(JSON.stringify(rpcSeen)).not.toContain(messageId);
  });

  it('reports 5 concurrent duplicates as one acquired and four in_progress, a failing handler as released', async () => {
    const messageId = randomUUID();
    const settled = await Promise.allSettled(Array.from({ length: 5 }, () => send({ messageId })));
    expect(settled.filter((s) => s.status === 'fulfilled')).toHaveLength(1);
    await until(() => typesOf(messageId).includes('completed'));
    const types = typesOf(messageId);
    expect(types.filter((t) => t === 'acquired')).toHaveLength(1);
    expect(types.filter((t) => t === 'in_progress')).toHaveLength(4);
    expect(types.filter((t) => t === 'completed')).toHaveLength(1);
    expect(types).toHaveLength(6);

    const failing = randomUUID();
    await expect(send({ messageId: failing, fail: true })).rejects.toBeDefined();
    await until(() => typesOf(failing).includes('released'));
    expect(typesOf(failing)).toEqual(['acquired', 'released']);
  });

  it('keeps the apps apart, and gives one key the same keyHash on two instances', async () => {
    const key = randomUUID();
    expect((await raw(http1.url, '/h', { key, body: { n: 1 } }).answer).status).toBe(201);
    expect(replayed(await raw(http2.url, '/h', { key, body: { n: 1 } }).answer)).toBe(true);
    const hash = sha(buildStorageKey({ prefix: PREFIX, user: { anonymous: true }, handler: 'HttpOrders.create', key }));
    expect(httpSeen1.filter((e) => e.type !== 'store_call').map((e) => [e.type, e.keyHash])).toEqual([
      ['acquired', hash],
      ['completed', hash],
    ]);
    expect(httpSeen2.filter((e) => e.type !== 'store_call').map((e) => [e.type, e.keyHash])).toEqual([['replayed', hash]]);
    expect(subscribed).toEqual(httpSeen1);
    expect(rpcSeen.some((e) => e.transport === 'http')).toBe(false);
    expect([...httpSeen1, ...httpSeen2].some((e) => e.transport === 'rpc')).toBe(false);
    for (const e of [...httpSeen1, ...httpSeen2, ...rpcSeen]) {
      expect(e.elapsedMs).toBeGreaterThanOrEqual(0);
      if ('handlerMs' in e) {
        expect(e.handlerMs).toBeGreaterThanOrEqual(0);
        expect(e.handlerMs).toBeLessThanOrEqual(e.elapsedMs);
      }
    }
  });
});
