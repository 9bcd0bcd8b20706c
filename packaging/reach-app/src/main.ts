// A user's app, outside the monorepo, written once and built twice (test/package-reach.e2e-spec.ts):
// as an ES module on Nest 12 (`module: nodenext`) and as CommonJS on Nest 11 (`module: commonjs`,
// `moduleResolution: node`), where `require()` loads the ESM-only package. So: no top-level await,
// no import.meta, no relative import. Sends one POST twice with the same Idempotency-Key through
// the guard on Redis (REDIS_URL, KEY_PREFIX) and prints one JSON line with what it saw.
import 'reflect-metadata';
import { Body, Controller, Module, Post } from '@nestjs/common';
import { NestFactory } from '@nestjs/core';
import { DocumentBuilder, SwaggerModule } from '@nestjs/swagger';
import { TerminusModule } from '@nestjs/terminus';
import { getMetadataArgsStorage } from 'typeorm';
import { IdempotencyModule, NoRepeatSubmit } from 'nestjs-idempotency';
import { IdempotencyHealthIndicator } from 'nestjs-idempotency/health';
import { IDEMPOTENCY_ENTITIES } from 'nestjs-idempotency/typeorm';

let runs = 0;

@Controller('payments')
class PaymentsController {
  @Post()
  @NoRepeatSubmit({ expireSeconds: 60 })
  pay(@Body() body: { amount: number }) {
    return { amount: body.amount, run: ++runs };
  }
}

@Module({
  imports: [IdempotencyModule.forRoot({ store: { redis: process.env.REDIS_URL! }, keyPrefix: process.env.KEY_PREFIX! }), TerminusModule],
  controllers: [PaymentsController],
  providers: [IdempotencyHealthIndicator],
})
class AppModule {}

async function main(): Promise<void> {
  const app = await NestFactory.create(AppModule, { logger: ['error'] });
  await app.listen(0, '127.0.0.1');
  try {
    const url = `${(await app.getUrl()).replace('[::1]', '127.0.0.1')}/payments`;
    const key = `reach-${Date.now()}`;
    const post = async () => {
      const res = await fetch(url, {
        method: 'POST',
        headers: { 'content-type': 'application/json', 'idempotency-key': key },
        body: JSON.stringify({ amount: 5 }),
      });
      return { status: res.status, replayed: res.headers.get('idempotent-replayed'), body: (await res.json()) as unknown };
    };
    const first = await post();
    const second = await post();

    const health = await app.get(IdempotencyHealthIndicator).isHealthy('idempotency');
    const document = SwaggerModule.createDocument(app, new DocumentBuilder().build());
    const keyHeader = document.paths['/payments']?.post?.parameters?.some((p) => 'name' in p && p.name === 'Idempotency-Key');
    // The package's entities are registered where this app's typeorm looks: one typeorm, not two.
    const entities = IDEMPOTENCY_ENTITIES.filter((entity) => getMetadataArgsStorage().tables.some((table) => table.target === entity));
    const moduleSystem = typeof require === 'function' ? 'commonjs' : 'module';

    console.log(JSON.stringify({ moduleSystem, first, second, runs, health: health.idempotency.status, keyHeader, entities: entities.length === IDEMPOTENCY_ENTITIES.length }));
  } finally {
    await app.close();
  }
}

main().catch((error: unknown) => {
  console.error(error);
  process.exitCode = 1;
});
