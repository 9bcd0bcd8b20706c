// A user's app, outside the monorepo: installs the packed tarballs and runs a request through the
// guard. Prints one JSON line with what it saw. STORE=redis uses REDIS_URL, else the memory store;
// METRICS=1 turns on the Prometheus metrics.
import 'reflect-metadata';
import { Body, Controller, Module, Post } from '@nestjs/common';
import { NestFactory } from '@nestjs/core';
import { IdempotencyModule, NoRepeatSubmit, type IdempotencyModuleOptions } from 'nestjs-idempotency';
import { createIdempotentClient } from 'nestjs-idempotency-client';

@Controller('payments')
class PaymentsController {
  private runs = 0;

  @Post()
  @NoRepeatSubmit({ expireSeconds: 60 })
  pay(@Body() body: { amount: number }) {
    return { amount: body.amount, run: ++this.runs };
  }
}

const store: IdempotencyModuleOptions['store'] = process.env.STORE === 'redis' ? { redis: process.env.REDIS_URL! } : undefined;

@Module({
  imports: [IdempotencyModule.forRoot({ store, keyPrefix: process.env.KEY_PREFIX ?? 'smoke', metrics: process.env.METRICS === '1' })],
  controllers: [PaymentsController],
})
class AppModule {}

const app = await NestFactory.create(AppModule, { logger: ['error'] });
await app.listen(0, '127.0.0.1');
const baseUrl = (await app.getUrl()).replace('[::1]', '127.0.0.1');
try {
  const key = crypto.randomUUID();
  const post = async () => {
    const res = await fetch(`${baseUrl}/payments`, {
      method: 'POST',
      headers: { 'content-type': 'application/json', 'idempotency-key': key },
      body: JSON.stringify({ amount: 5 }),
    });
    return { status: res.status, replayed: res.headers.get('idempotent-replayed'), body: (await res.json()) as unknown };
  };
  const first = await post();
  const second = await post();

  const client = createIdempotentClient({ baseUrl });
  const created = await client.post('/payments', { amount: 6 });
  const again = await client.post('/payments', { amount: 6 }, { key: created.key });
  const viaClient = [created, again].map(({ status, replayed, attempts, body }) => ({ status, replayed, attempts, body }));
  console.log(JSON.stringify({ first, second, viaClient }));
} finally {
  await app.close();
}
