// @LeaseSignal() behind a global ValidationPipe that validates custom parameters: the README's
// own `@LeaseSignal() signal: AbortSignal` answered 500 "Illegal constructor" on every request
// (the pipe rebuilt the parameter as its declared class, and AbortSignal has no constructor for
// it), with or without the guard's other options (an adversarial helper).
import { afterAll, beforeAll, describe, expect, it } from '@jest/globals';
import { Body, Controller, Post, ValidationPipe } from '@nestjs/common';
import { IsString } from 'class-validator';
import { randomUUID } from 'node:crypto';
import { LeaseSignal, NoRepeatSubmit } from '../libs/idempotency/src/index.js';
import { makeApp, replayed, send, type Adapter, type EdgeApp } from './support/edge-app.js';
import { REDIS_URL } from './support/services.js';

class PayDto {
  @IsString()
  orderNo!: string;
}

@Controller('payments')
class PaymentsController {
  @Post()
  @NoRepeatSubmit()
  pay(@Body() dto: PayDto, @LeaseSignal() signal: AbortSignal) {
    return { orderNo: dto.orderNo, signal: signal instanceof AbortSignal, aborted: signal.aborted };
  }
}

describe.each<Adapter>(['express', 'fastify'])('@LeaseSignal() behind ValidationPipe({ transform, validateCustomDecorators }) (%s)', (adapter) => {
  let edge: EdgeApp;
  beforeAll(async () => {
    edge = await makeApp(adapter, [PaymentsController], { store: { redis: REDIS_URL }, keyPrefix: `lease-pipes-${randomUUID()}` }, {
      setup: (app) => void app.useGlobalPipes(new ValidationPipe({ transform: true, whitelist: true, validateCustomDecorators: true })),
    });
  });
  afterAll(() => edge.close());

  it('hands the handler its signal, and the pipe still validates the body', async () => {
    const key = randomUUID();
    const first = await send(edge.url, '/payments', { key, body: { orderNo: 'P-1' } });
    const retry = await send(edge.url, '/payments', { key, body: { orderNo: 'P-1' } });
    const invalid = await send(edge.url, '/payments', { key: randomUUID(), body: { orderNo: 7 } });
    expect({ statuses: [first.status, retry.status, invalid.status], body: JSON.parse(first.text), replayed: replayed(retry) }).toEqual({
      statuses: [201, 201, 400],
      body: { orderNo: 'P-1', signal: true, aborted: false },
      replayed: true,
    });
  });
});
