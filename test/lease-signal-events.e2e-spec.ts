// @LeaseSignal() on message handlers over the Redis transport. Nest calls every
// @EventPattern handler of one pattern with the same (data, context) objects; each guarded
// handler holds its own claim (the handler is part of the key), so each must get its own signal,
// and only the handler whose claim is lost may see its signal abort.
import { afterAll, beforeAll, describe, expect, it } from '@jest/globals';
import { Controller, Injectable, Module, type INestMicroservice } from '@nestjs/common';
import { NestFactory } from '@nestjs/core';
import { ClientProxyFactory, EventPattern, Payload, Transport, type ClientProxy, type RedisOptions } from '@nestjs/microservices';
import type { Redis } from 'ioredis';
import { randomUUID } from 'node:crypto';
import { firstValueFrom } from 'rxjs';
import { IdempotencyModule, LeaseSignal, NoRepeatSubmit } from '../libs/idempotency/src/index.js';
import { sleep } from './support/edge-app.js';
import { until } from './support/http.js';
import { REDIS_URL, connectRedis } from './support/services.js';

const PREFIX = `rpcsig-${randomUUID().slice(0, 8)}`;

@Injectable()
class Seen {
  signals: Record<string, AbortSignal> = {};
  done: Record<string, boolean> = {};
}

const hold = async (seen: Seen, who: string, signal: AbortSignal) => {
  seen.signals[who] = signal;
  await Promise.race([sleep(4000), new Promise((resolve) => signal.addEventListener('abort', resolve))]);
  seen.done[who] = true;
};

@Controller()
class ShippingListener {
  constructor(private readonly seen: Seen) {}

  @EventPattern('lease.order.paid')
  @NoRepeatSubmit({ idempotentKey: '#data.id', leaseSeconds: 1.2 })
  ship(@Payload() _data: { id: string }, @LeaseSignal() signal: unknown) {
    // `unknown`: Nest 12 types an @EventPattern handler as (data, ...args: unknown[]).
    return hold(this.seen, 'ship', signal as AbortSignal);
  }
}

@Controller()
class InvoiceListener {
  constructor(private readonly seen: Seen) {}

  @EventPattern('lease.order.paid')
  @NoRepeatSubmit({ idempotentKey: '#data.id', leaseSeconds: 1.2 })
  invoice(@Payload() _data: { id: string }, @LeaseSignal() signal: unknown) {
    return hold(this.seen, 'invoice', signal as AbortSignal);
  }
}

const { hostname: host, port } = new URL(REDIS_URL);
const transport: RedisOptions = { transport: Transport.REDIS, options: { host, port: Number(port) } };

@Module({
  imports: [IdempotencyModule.forRoot({ store: { redis: REDIS_URL }, keyPrefix: PREFIX })],
  controllers: [ShippingListener, InvoiceListener],
  providers: [Seen],
})
class ListenersModule {}

describe('two guarded event handlers of one pattern (Redis transport)', () => {
  let server: INestMicroservice;
  let client: ClientProxy;
  let redis: Redis;
  let seen: Seen;

  beforeAll(async () => {
    server = await NestFactory.createMicroservice(ListenersModule, { ...transport, logger: false });
    await server.listen();
    seen = server.get(Seen);
    client = ClientProxyFactory.create(transport);
    await client.connect();
    redis = await connectRedis();
  });
  afterAll(async () => {
    await client?.close();
    await server?.close();
    redis?.disconnect();
  });

  it('gives each handler its own signal, and aborts only the one whose claim is lost', async () => {
    const id = randomUUID();
    await firstValueFrom(client.emit('lease.order.paid', { id }));
    await until(() => Boolean(seen.signals.ship && seen.signals.invoice));
    const sameSignal = seen.signals.ship === seen.signals.invoice;

    // The invoice handler's record goes (an operator, an eviction): its claim is lost, the shipping one is not.
    const keys = await redis.keys(`${PREFIX}:*`);
    const invoiceKey = keys.find((key) => key.includes('InvoiceListener'));
    expect(invoiceKey).toBeDefined();
    await redis.del(invoiceKey!);
    await sleep(1600); // more than a lease (1.2 s: a loaded CI machine can stall the renewals of a shorter one): the invoice claim's next renewal is refused
    expect({ sameSignal, ship: seen.signals.ship.aborted, invoice: seen.signals.invoice.aborted }).toEqual({
      sameSignal: false,
      ship: false,
      invoice: true,
    });
    await until(() => Boolean(seen.done.ship && seen.done.invoice), 6000);
  }, 15_000);
});
