import 'reflect-metadata';
import type { INestApplication } from '@nestjs/common';
import { NestFactory } from '@nestjs/core';
import { ExpressAdapter } from '@nestjs/platform-express';
import { FastifyAdapter } from '@nestjs/platform-fastify';
import { isArmName, type AdapterName } from '../arm-names.js';
import { IdempotencyStore, LocalCacheIdempotencyStore, RedisIdempotencyStore } from '../../../libs/idempotency/src/index.js';
import { armModule } from './arm-modules.js';
import { ArmUnavailable } from './postgres-arm.js';
import { HandlerRuns } from './orders.controller.js';

/**
 * One arm as its own process: `ARM`, `ADAPTER`, `PORT`, `REDIS_URL`, `DATABASE_URL`,
 * `PG_SCHEMA`, `CRASH_LEASE_SECONDS`. Prints `READY <port>` when it listens, `UNAVAILABLE <reason>` (exit 3)
 * when the arm cannot run yet.
 */
async function main(): Promise<void> {
  const arm = process.env.ARM ?? '';
  if (!isArmName(arm)) throw new Error(`ARM must name an arm, got "${arm}"`);
  const adapter = (process.env.ADAPTER ?? 'express') as AdapterName;
  const port = Number(process.env.PORT);
  const module = await armModule(arm, {
    redisUrl: process.env.REDIS_URL ?? 'redis://127.0.0.1:6379',
    databaseUrl: process.env.DATABASE_URL ?? 'postgres://postgres@127.0.0.1:5432/test',
    postgresSchema: process.env.PG_SCHEMA,
    crashLeaseSeconds: Number(process.env.CRASH_LEASE_SECONDS ?? 3),
  });
  // The guard no longer needs rawBody (it fingerprints what the body parser gives), so no arm
  // pays for it; the lever arm guard-redis-raw-body shows what it costs an app that keeps it.
  const rawBody = arm === 'guard-redis-raw-body';
  const options = { rawBody, logger: ['error' as const] };
  const app: INestApplication =
    adapter === 'fastify'
      ? await NestFactory.create(module, new FastifyAdapter(), options)
      : await NestFactory.create(module, new ExpressAdapter(), options);
  if (arm.startsWith('guard-redis')) countRedisCommands(app);
  // A normal exit on SIGTERM, so `--cpu-prof` writes its profile (the driver SIGKILLs otherwise).
  process.once('SIGTERM', () => void app.close().finally(() => process.exit(0)));
  await app.listen(port, '127.0.0.1');
  process.stdout.write(`READY ${port}\n`);
}

/**
 * Counts the commands the guard's Redis client sends (each one round trip). Redis's own
 * `INFO commandstats` also counts the commands a script runs, under the same names (a claim is a
 * `SET`, and so is the write inside the complete script): only the client can tell them apart.
 */
function countRedisCommands(app: INestApplication): void {
  const provided = app.get(IdempotencyStore, { strict: false }) as unknown;
  // With localCache, the Redis store stands behind the cache; the cache's tracked reads count too.
  const store = provided instanceof LocalCacheIdempotencyStore ? provided.store : provided;
  if (!(store instanceof RedisIdempotencyStore)) throw new Error('a guard-redis arm without a Redis store');
  const runs = app.get(HandlerRuns);
  runs.redisCommands = 0;
  const client = store.client;
  const send = client.sendCommand.bind(client) as (...args: unknown[]) => unknown;
  (client as unknown as { sendCommand: typeof send }).sendCommand = (...args) => {
    runs.redisCommands!++;
    return send(...args);
  };
}

main().catch((error: unknown) => {
  if (error instanceof ArmUnavailable) {
    process.stdout.write(`UNAVAILABLE ${error.message}\n`);
    process.exit(3);
  }
  process.stderr.write(`${error instanceof Error ? (error.stack ?? error.message) : String(error)}\n`);
  process.exit(1);
});
