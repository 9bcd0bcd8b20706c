// A process for `test/http2.e2e-spec.ts`, run from the sources:
//   node --import ./test/support/ts-register.mjs test/support/http2-warning-child.ts
// Node prints a warning once a process, so a fresh process is the only one that can show it:
// a Fastify app over HTTP/2 (h2c) with a guarded route answers one call and its replay, then
// the process prints the warnings it emitted, one JSON line: `{"statuses":[...],"warnings":[...]}`.
import 'reflect-metadata';
import { Controller, Module, Post } from '@nestjs/common';
import { NestFactory } from '@nestjs/core';
import { FastifyAdapter } from '@nestjs/platform-fastify';
import { connect } from 'node:http2';
import { IdempotencyModule, MemoryIdempotencyStore, NoRepeatSubmit } from '../../libs/idempotency/src/index.js';

const warnings: string[] = [];
process.on('warning', (warning) => warnings.push(`${warning.name}: ${warning.message}`));

@Controller('orders')
class OrdersController {
  @Post()
  @NoRepeatSubmit()
  create() {
    return { ok: true };
  }
}

@Module({ imports: [IdempotencyModule.forRoot({ store: new MemoryIdempotencyStore() })], controllers: [OrdersController] })
class AppModule {}

const app = await NestFactory.create(AppModule, new FastifyAdapter({ http2: true }) as never, { logger: false });
await app.listen(0, '127.0.0.1');
const session = connect(`http://127.0.0.1:${(app.getHttpServer().address() as { port: number }).port}`);
const post = () =>
  new Promise<number>((resolve, reject) => {
    const stream = session.request({ ':method': 'POST', ':path': '/orders', 'content-type': 'application/json', 'idempotency-key': 'k-1' });
    let status = 0;
    stream.on('response', (headers) => (status = Number(headers[':status'])));
    stream.on('data', () => undefined);
    stream.on('end', () => resolve(status));
    stream.on('error', reject);
    stream.end('{}');
  });
const statuses = [await post(), await post()];
session.close();
await app.close();
// Warnings are emitted on the next tick.
await new Promise((resolve) => setImmediate(resolve));
process.stdout.write(`${JSON.stringify({ statuses, warnings })}\n`);
