// A hybrid app started as Nest's docs show it: `connectMicroservice()`, `startAllMicroservices()`,
// then `listen()`. The microservices take messages from `startAllMicroservices()` on, before the
// module's init hooks run (they run in `listen()`), and the Redis client the module opens was
// connected only in its `onModuleInit`: each command failed at once, as an outage, and under the
// default fail-open a backlog of one message's copies ran it 11 to 20 times (an adversarial helper).
import { afterAll, beforeAll, describe, expect, it, jest } from '@jest/globals';
import { Body, Controller, Logger, Module, Post, type INestApplication } from '@nestjs/common';
import { NestFactory } from '@nestjs/core';
import { ClientProxyFactory, EventPattern, MessagePattern, Payload, Transport, type ClientProxy } from '@nestjs/microservices';
import { randomUUID } from 'node:crypto';
import { firstValueFrom } from 'rxjs';
import { IdempotencyModule, NoRepeatSubmit } from '../libs/idempotency/src/index.js';
import { freePort } from './support/redis-server.js';
import { REDIS_URL } from './support/services.js';

let runs = 0;

@Controller()
class PaymentsController {
  @MessagePattern('pay')
  @NoRepeatSubmit({ idempotentKey: '#data.paymentId' })
  async pay(@Payload() data: { paymentId: string }) {
    runs++;
    await new Promise((resolve) => setTimeout(resolve, 50));
    return { paid: data.paymentId };
  }
}

@Module({
  imports: [IdempotencyModule.forRoot({ store: { redis: REDIS_URL }, keyPrefix: `hybrid${randomUUID().slice(0, 8)}` })],
  controllers: [PaymentsController],
})
class HybridModule {}

describe('a hybrid app: messages before listen()', () => {
  let app: INestApplication;
  let client: ClientProxy;
  let port: number;
  beforeAll(async () => {
    port = await freePort();
    app = await NestFactory.create(HybridModule, { logger: false });
    app.connectMicroservice({ transport: Transport.TCP, options: { host: '127.0.0.1', port } });
    await app.startAllMicroservices();
    client = ClientProxyFactory.create({ transport: Transport.TCP, options: { host: '127.0.0.1', port } });
    await client.connect();
  });
  afterAll(async () => {
    client?.close();
    await app?.close();
  });

  it('runs a message sent 20 times at once once, before the app listens', async () => {
    runs = 0;
    const paymentId = randomUUID();
    const answers = await Promise.allSettled(Array.from({ length: 20 }, () => firstValueFrom(client.send('pay', { paymentId }))));
    const settled = answers.map((a) => (a.status === 'fulfilled' ? 'answered' : 'refused'));
    // Observed before: 20 runs ("idempotency store unavailable ... running unguarded").
    expect({ runs, answered: settled.filter((s) => s === 'answered').length >= 1 }).toEqual({ runs: 1, answered: true });
    // The app's listen() then runs the module's init hooks on the connected store.
    await app.listen(0, '127.0.0.1');
    const again = await firstValueFrom(client.send('pay', { paymentId }));
    expect({ again, runs }).toEqual({ again: { paid: paymentId }, runs: 1 });
  });
});

// A class-level key expression for HTTP over a controller with an @EventPattern: every event was
// refused as keyless and dropped, said only per message (an adversarial helper).
@Controller('shipments')
@NoRepeatSubmit({ idempotentKey: '#body.shipmentNo' })
class ShipmentsController {
  @Post()
  create(@Body() body: { shipmentNo: string }) {
    return body;
  }

  @EventPattern('shipment.created')
  created(@Payload() data: unknown) {
    return data;
  }

  @Post('labels')
  @NoRepeatSubmit({ idempotentKey: '#data.labelNo' })
  label(@Body() body: unknown) {
    return body;
  }

  /** One method for both (an adversarial helper: no word at start-up, each event dropped or run unguarded). */
  @Post('returns')
  @EventPattern('shipment.returned')
  @NoRepeatSubmit({ idempotentKey: '#body.returnNo' })
  returned(@Body() body: unknown) {
    return body;
  }
}

@Module({ imports: [IdempotencyModule.forRoot({})], controllers: [ShipmentsController] })
class ShipmentsModule {}

describe('key expressions that read where the calls carry none', () => {
  it('are named at start-up: an HTTP root on a message handler, #data on an HTTP route', async () => {
    const warn = jest.spyOn(Logger.prototype, 'warn').mockImplementation(() => undefined);
    const app = await NestFactory.create(ShipmentsModule, { logger: false });
    try {
      await app.init();
      const said = warn.mock.calls.map((call) => String(call[0])).filter((text) => text.includes('key expression'));
      // Observed before: nothing at start-up.
      expect(said).toEqual([
        expect.stringMatching(/^ShipmentsController\.created is a message handler, and its key expression #body\.shipmentNo reads the body field "shipmentNo"/),
        expect.stringMatching(/^ShipmentsController\.label is an HTTP route, and its key expression #data\.labelNo reads a message's data/),
        expect.stringMatching(
          /^ShipmentsController\.returned is an HTTP route and a message handler, and its key expression #body\.returnNo reads the body field "returnNo" of an HTTP request: no message carries a key there/,
        ),
      ]);
    } finally {
      warn.mockRestore();
      await app.close();
    }
  });
});

// A class-level @NoRepeatSubmit() without a key expression over a controller with message
// handlers: each read the Idempotency-Key header, which no message carries. Every message was
// refused and every event dropped, with no word at start-up (an adversarial helper: 20 of 20
// events, TCP).
@Controller('parcels')
@NoRepeatSubmit({ expireSeconds: 3600 })
class ParcelsController {
  @Post()
  create(@Body() body: unknown) {
    return body;
  }

  @EventPattern('parcel.created')
  created(@Payload() data: unknown) {
    return data;
  }

  @MessagePattern('parcel.get')
  @NoRepeatSubmit({ idempotentKey: '#data.requestId' })
  get(@Payload() data: unknown) {
    return data;
  }

  /** Keyed by its content: guarded without a key (a reviewing helper saw it named wrongly). */
  @MessagePattern('parcel.track')
  @NoRepeatSubmit({ useRequestFingerprint: true })
  track(@Payload() data: unknown) {
    return data;
  }
}

@Module({ imports: [IdempotencyModule.forRoot({})], controllers: [ParcelsController] })
class ParcelsModule {}

describe('message handlers keyed by the key header', () => {
  it('are named at start-up, and those with a #data key or keyed by their content are not', async () => {
    const warn = jest.spyOn(Logger.prototype, 'warn').mockImplementation(() => undefined);
    const app = await NestFactory.create(ParcelsModule, { logger: false });
    try {
      await app.init();
      const said = warn.mock.calls.map((call) => String(call[0])).filter((text) => text.includes('key header'));
      // Observed before: nothing at start-up.
      expect(said).toEqual([expect.stringMatching(/^ParcelsController\.created is a message handler keyed by the idempotency key header .*idempotentKey: '#data\.<field>'/)]);
    } finally {
      warn.mockRestore();
      await app.close();
    }
  });
});
