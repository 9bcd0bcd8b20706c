import { afterAll, beforeAll, describe, expect, it, jest } from '@jest/globals';
import { ClassSerializerInterceptor, Controller, Injectable, Logger, Module, SerializeOptions, type INestMicroservice } from '@nestjs/common';
import { APP_INTERCEPTOR, NestFactory } from '@nestjs/core';
import { Exclude, Expose } from 'class-transformer';
import {
  ClientProxyFactory,
  Ctx,
  EventPattern,
  MessagePattern,
  Payload,
  RedisContext,
  Transport,
  type ClientProxy,
  type RedisOptions,
} from '@nestjs/microservices';
import { randomUUID } from 'node:crypto';
import { firstValueFrom } from 'rxjs';
import { IdempotencyModule, NoRepeatSubmit, type IdempotencyEvent } from '../libs/idempotency/src/index.js';
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
  /** The message ids the handlers with results JSON cannot hold ran for, once per run. */
  unkept: string[] = [];
  /** `<pattern> <orderNo>`, once per run of the handler of two patterns. */
  orderEvents: string[] = [];
  /** The channel of each run of the wildcard handler. */
  shopOrders: string[] = [];
  users = 0;
  large = 0;
}

/** A user as the app's global ClassSerializerInterceptor sends it: never its password hash. */
class UserView {
  id!: string;
  name!: string;
  @Exclude()
  passwordHash!: string;

  constructor(fields: UserView) {
    Object.assign(this, fields);
  }
}

/** Sent under `@SerializeOptions({ excludeExtraneousValues: true })`: only what it exposes. */
class ExposedUser {
  @Expose() id!: string;
  @Expose() name!: string;
  passwordHash!: string;

  constructor(fields: { id: string; name: string; passwordHash: string }) {
    Object.assign(this, fields);
  }
}

/** Its exposed getter throws (a relation not loaded): the serializer fails, the first caller gets an error. */
class BrokenUser extends UserView {
  @Expose()
  get fullName(): string {
    throw new Error('the relation "profile" is not loaded');
  }
}

/** Results JSON cannot hold: a BigInt, an object that refers to itself (an AxiosResponse, an entity with two-way relations), a Buffer. */
type Unkept = 'bigint' | 'cycle' | 'buffer';
function unkeptResult(kind: Unkept): unknown {
  if (kind === 'bigint') return { processed: 1n };
  if (kind === 'buffer') return Buffer.from('done');
  const cycle: Record<string, unknown> = { processed: 1 };
  cycle.self = cycle;
  return cycle;
}

/** What the guard reported settling, per handler: `completed` or `released` events. */
const settled: IdempotencyEvent[] = [];
const settledOf = (handler: string) => settled.filter((event) => event.handler === handler).length;

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

  @EventPattern(['order.created', 'order.cancelled'])
  @NoRepeatSubmit({ idempotentKey: '#data.orderNo' })
  orderEvent(@Payload() data: OrderMessage, @Ctx() ctx: RedisContext) {
    this.handled.orderEvents.push(`${ctx.getChannel()} ${data.orderNo}`);
  }

  @MessagePattern('users.create')
  @NoRepeatSubmit({ idempotentKey: '#data.messageId' })
  createUser(@Payload() data: OrderMessage) {
    this.handled.users++;
    return new UserView({ id: data.messageId!, name: data.orderNo, passwordHash: 'SECRET-HASH' });
  }

  @MessagePattern('users.create-exposed')
  @SerializeOptions({ excludeExtraneousValues: true })
  @NoRepeatSubmit({ idempotentKey: '#data.messageId' })
  createExposedUser(@Payload() data: OrderMessage) {
    this.handled.users++;
    return new ExposedUser({ id: data.messageId!, name: data.orderNo, passwordHash: 'SECRET-HASH' });
  }

  @MessagePattern('users.create-broken')
  @NoRepeatSubmit({ idempotentKey: '#data.messageId' })
  createBrokenUser(@Payload() data: OrderMessage) {
    this.handled.users++;
    return new BrokenUser({ id: data.messageId!, name: data.orderNo, passwordHash: 'SECRET-HASH' });
  }

  @MessagePattern('orders.large')
  @NoRepeatSubmit({ idempotentKey: '#data.messageId', maxResponseBytes: 100 })
  largeResult(@Payload() data: OrderMessage) {
    this.handled.large++;
    return { orderNo: data.orderNo, lines: 'x'.repeat(1000) };
  }

  /** One pattern for every shop (a wildcard): the shop is in the channel. */
  @MessagePattern('shops.*.orders')
  @NoRepeatSubmit({ idempotentKey: '#data.orderNo' })
  shopOrder(@Payload() data: OrderMessage, @Ctx() ctx: RedisContext) {
    this.handled.shopOrders.push(ctx.getChannel());
    return { shop: ctx.getChannel().split('.')[1], orderNo: data.orderNo };
  }

  @EventPattern('payment.unkept')
  @NoRepeatSubmit({ idempotentKey: '#data.messageId' })
  unkeptEvent(@Payload() data: OrderMessage & { result: Unkept }) {
    this.handled.unkept.push(data.messageId!);
    return unkeptResult(data.result);
  }

  @MessagePattern('orders.unkept')
  @NoRepeatSubmit({ idempotentKey: '#data.messageId' })
  unkeptMessage(@Payload() data: OrderMessage & { result: Unkept }) {
    this.handled.unkept.push(data.messageId!);
    // Nest's Redis transport sends a Buffer (as JSON); a BigInt or a cycle it cannot send at all.
    return unkeptResult(data.result);
  }
}

const { hostname: host, port } = new URL(REDIS_URL);
const transport: RedisOptions = { transport: Transport.REDIS, options: { host, port: Number(port) } };

@Module({
  imports: [
    IdempotencyModule.forRoot({
      store: { redis: REDIS_URL },
      keyPrefix: `rpc-${randomUUID()}`,
      onEvent: (event) => {
        if (event.type === 'completed' || event.type === 'released') settled.push(event);
      },
    }),
  ],
  controllers: [RpcController],
  providers: [Handled, { provide: APP_INTERCEPTOR, useClass: ClassSerializerInterceptor }],
})
class RpcTestModule {}

describe('@NoRepeatSubmit on microservice handlers, over the Redis transport', () => {
  let server: INestMicroservice;
  let client: ClientProxy;
  let handled: Handled;

  beforeAll(async () => {
    server = await NestFactory.createMicroservice(RpcTestModule, { ...transport, options: { ...transport.options, wildcards: true }, logger: ['error'] });
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

  // An adversarial helper (session 19): one handler of two patterns keyed by the order number took
  // `order.cancelled` of an order for a duplicate of its `order.created`, and dropped it.
  it('keys a handler of several patterns by the pattern too: another pattern with the same key runs, a copy is dropped', async () => {
    const orderNo = `O-${randomUUID()}`;
    await firstValueFrom(client.emit('order.created', { orderNo }));
    await until(() => handled.orderEvents.includes(`order.created ${orderNo}`));
    await firstValueFrom(client.emit('order.cancelled', { orderNo }));
    await until(() => handled.orderEvents.includes(`order.cancelled ${orderNo}`));
    await firstValueFrom(client.emit('order.created', { orderNo })); // a copy
    const marker = `M-${randomUUID()}`;
    await firstValueFrom(client.emit('order.created', { orderNo: marker }));
    await until(() => handled.orderEvents.includes(`order.created ${marker}`));
    expect(handled.orderEvents.filter((event) => event.endsWith(` ${orderNo}`))).toEqual([`order.created ${orderNo}`, `order.cancelled ${orderNo}`]);
  });

  // An adversarial helper (session 20): the guard saved the handler's own value, so a duplicate
  // got the passwordHash the app's global ClassSerializerInterceptor had kept from the first.
  it("replays a message's result as the app's serializer sent it: the @Exclude()d field never", async () => {
    const messageId = randomUUID();
    const first = await firstValueFrom(client.send('users.create', { messageId, orderNo: 'ann' }));
    const again = await firstValueFrom(client.send('users.create', { messageId, orderNo: 'ann' }));
    expect({ first, again, runs: handled.users }).toEqual({
      first: { id: messageId, name: 'ann' },
      again: { id: messageId, name: 'ann' },
      runs: 1,
    });
  });

  // A third round: @SerializeOptions were not applied (excludeExtraneousValues leaked the hash),
  // and a serializer that threw left the raw JSON, hash included, to the duplicate.
  it("applies the route's @SerializeOptions, and keeps nothing when the serializer fails on the result", async () => {
    const exposed = randomUUID();
    await firstValueFrom(client.send('users.create-exposed', { messageId: exposed, orderNo: 'bo' }));
    const again = await firstValueFrom(client.send('users.create-exposed', { messageId: exposed, orderNo: 'bo' }));
    expect(again).toEqual({ id: exposed, name: 'bo' });
    const broken = randomUUID();
    await expect(firstValueFrom(client.send('users.create-broken', { messageId: broken, orderNo: 'cy' }))).rejects.toBeDefined();
    await expect(firstValueFrom(client.send('users.create-broken', { messageId: broken, orderNo: 'cy' }))).rejects.toMatchObject({
      code: 'IDEMPOTENCY_RESPONSE_NOT_REPLAYABLE',
    });
  });

  // An adversarial helper (session 20): a 2 MB result was kept in the store for each key.
  it('keeps no message result over maxResponseBytes: a duplicate is refused IDEMPOTENCY_RESPONSE_NOT_REPLAYABLE, no second run', async () => {
    const messageId = randomUUID();
    await firstValueFrom(client.send('orders.large', { messageId, orderNo: 'L-1' }));
    await expect(firstValueFrom(client.send('orders.large', { messageId, orderNo: 'L-1' }))).rejects.toMatchObject({
      code: 'IDEMPOTENCY_RESPONSE_NOT_REPLAYABLE',
    });
    expect(handled.large).toBe(1);
  });

  // An adversarial helper (session 20): keyed as its handler, shop b's order with shop a's
  // order number got shop a's saved result, and shop b's order was never made.
  it('keys a pattern with wildcards by what it matched: one shop never gets another shop\'s result', async () => {
    const orderNo = `S-${randomUUID()}`;
    const order = (shop: string) => firstValueFrom(client.send<{ shop: string }>(`shops.${shop}.orders`, { orderNo }));
    const a = await order('a');
    const b = await order('b');
    const aAgain = await order('a');
    expect({ a: a.shop, b: b.shop, aAgain: aAgain.shop, runs: handled.shopOrders }).toEqual({
      a: 'a',
      b: 'b',
      aAgain: 'a',
      runs: ['shops.a.orders', 'shops.b.orders'],
    });
  });

  // An adversarial helper (session 19): a result JSON cannot hold released the key after the
  // handler's effect, and every redelivery ran it again (3 runs of 3 deliveries), with no log.
  it.each(['bigint', 'cycle', 'buffer'] as const)(
    'drops every redelivery of an event whose handler returned what JSON cannot hold (%s): one run',
    async (result) => {
      const messageId = randomUUID();
      const before = settledOf('RpcController.unkeptEvent');
      await firstValueFrom(client.emit('payment.unkept', { messageId, orderNo: 'U-1', result }));
      // Redelivered once the first delivery settled, not while it runs (that copy is dropped either way).
      await until(() => settledOf('RpcController.unkeptEvent') > before);
      for (let copy = 0; copy < 2; copy++) await firstValueFrom(client.emit('payment.unkept', { messageId, orderNo: 'U-1', result }));
      const marker = randomUUID();
      await firstValueFrom(client.emit('payment.unkept', { messageId: marker, orderNo: 'U-marker', result }));
      await until(() => handled.unkept.includes(marker));
      expect(handled.unkept.filter((id) => id === messageId)).toHaveLength(1);
    },
  );

  it('refuses a duplicate message whose first result JSON could not hold IDEMPOTENCY_RESPONSE_NOT_REPLAYABLE, without running it again', async () => {
    const messageId = randomUUID();
    const warn = jest.spyOn(Logger.prototype, 'warn');
    await firstValueFrom(client.send('orders.unkept', { messageId, orderNo: 'U-2', result: 'buffer' }));
    await expect(firstValueFrom(client.send('orders.unkept', { messageId, orderNo: 'U-2', result: 'buffer' }))).rejects.toMatchObject({
      code: 'IDEMPOTENCY_RESPONSE_NOT_REPLAYABLE',
    });
    expect(handled.unkept.filter((id) => id === messageId)).toHaveLength(1);
    expect(settled.filter((event) => event.handler === 'RpcController.unkeptMessage').at(-1)).toMatchObject({
      type: 'completed',
      unreplayable: 'not_serializable',
    });
    // Said once per handler: the developer learns why duplicates are refused.
    expect(warn.mock.calls.filter(([message]) => String(message).startsWith('RpcController.unkeptMessage: its result cannot be kept'))).toHaveLength(1);
    warn.mockRestore();
  });
});
