import { afterAll, beforeAll, describe, expect, it } from '@jest/globals';
import { Controller, Injectable, Module, type INestMicroservice } from '@nestjs/common';
import { NestFactory } from '@nestjs/core';
import {
  ClientProxyFactory,
  EventPattern,
  MessagePattern,
  Payload,
  Transport,
  type ClientProxy,
  type RedisOptions,
} from '@nestjs/microservices';
import { randomUUID } from 'node:crypto';
import { firstValueFrom } from 'rxjs';
import { IdempotencyModule, NoRepeatSubmit } from '../libs/idempotency/src/index.js';
import { until } from './support/http.js';
import { REDIS_URL } from './support/services.js';

interface OrderMessage {
  messageId?: string;
  orderNo: string;
}

@Injectable()
class Handled {
  messages = 0;
  events: string[] = [];
}

@Controller()
class RpcController {
  constructor(private readonly handled: Handled) {}

  @MessagePattern('orders.create')
  @NoRepeatSubmit({ idempotentKey: '#data.messageId', waitForResultMs: 5000 })
  async create(@Payload() data: OrderMessage) {
    this.handled.messages++;
    await new Promise((resolve) => setTimeout(resolve, 50)); // long enough for duplicates to overlap
    return { orderNo: data.orderNo, run: this.handled.messages };
  }

  @EventPattern('payment.succeeded')
  @NoRepeatSubmit({ idempotentKey: '#data.messageId' })
  paid(@Payload() data: OrderMessage) {
    this.handled.events.push(data.orderNo);
  }
}

const { hostname: host, port } = new URL(REDIS_URL);
const transport: RedisOptions = { transport: Transport.REDIS, options: { host, port: Number(port) } };

@Module({
  imports: [IdempotencyModule.forRoot({ store: { redis: REDIS_URL }, keyPrefix: `rpc-${randomUUID()}` })],
  controllers: [RpcController],
  providers: [Handled],
})
class RpcTestModule {}

describe('@NoRepeatSubmit on microservice handlers, over the Redis transport', () => {
  let server: INestMicroservice;
  let client: ClientProxy;
  let handled: Handled;

  beforeAll(async () => {
    server = await NestFactory.createMicroservice(RpcTestModule, { ...transport, logger: ['error'] });
    await server.listen();
    handled = server.get(Handled);
    client = ClientProxyFactory.create(transport);
    await client.connect();
  });
  afterAll(async () => {
    await client?.close();
    await server?.close();
  });

  const send = (data: OrderMessage) => firstValueFrom(client.send<{ orderNo: string; run: number }>('orders.create', data));

  it('answers a duplicate message with the saved result, without running the handler again', async () => {
    const messageId = randomUUID();
    const first = await send({ messageId, orderNo: 'R-1' });
    const again = await send({ messageId, orderNo: 'R-1' });
    expect(again).toEqual(first);
    expect(handled.messages).toBe(first.run);
  });

  it('gives 20 concurrent duplicates the one result (they wait for it)', async () => {
    const messageId = randomUUID();
    const before = handled.messages;
    const answers = await Promise.all(Array.from({ length: 20 }, () => send({ messageId, orderNo: 'R-2' })));
    expect(handled.messages).toBe(before + 1);
    expect(new Set(answers.map((a) => JSON.stringify(a))).size).toBe(1);
  });

  it('refuses the same id with another payload, and a message without an id, with a code', async () => {
    const messageId = randomUUID();
    await send({ messageId, orderNo: 'R-3' });
    await expect(send({ messageId, orderNo: 'R-other' })).rejects.toMatchObject({ code: 'IDEMPOTENCY_KEY_REUSED' });
    await expect(send({ orderNo: 'R-4' })).rejects.toMatchObject({ code: 'IDEMPOTENCY_KEY_MISSING' });
  });

  it('drops a duplicate event', async () => {
    const messageId = randomUUID();
    const orderNo = `E-${messageId}`;
    const marker = `M-${randomUUID()}`;
    await firstValueFrom(client.emit('payment.succeeded', { messageId, orderNo }));
    await firstValueFrom(client.emit('payment.succeeded', { messageId, orderNo }));
    // Events on one channel arrive in order: once the marker is handled, the duplicate was too.
    await firstValueFrom(client.emit('payment.succeeded', { messageId: randomUUID(), orderNo: marker }));
    await until(() => handled.events.includes(marker));
    expect(handled.events.filter((no) => no === orderNo)).toHaveLength(1);
  });
});
