import 'reflect-metadata';
import { Logger, type INestApplication } from '@nestjs/common';
import { createDemoApp } from './demo-app.factory.js';
import { adapterFromEnv, portFromEnv } from './demo-env.js';
import type { EmbeddedDatabase } from './embedded-database.js';
import { redactUrl } from './redact-url.js';

const logger = new Logger('Bootstrap');

/**
 * Starts the demo from the environment: `PORT` (default 3000), `HOST` (default 127.0.0.1, both
 * adapters; 0.0.0.0 in a container),
 * `HTTP_ADAPTER` (`express` | `fastify`), `DATABASE_URL` (default: an embedded PostgreSQL in
 * `.data/pg`), `REDIS_URL` (default: the memory store; with it the demo also serves the
 * `orders.create` message pattern over the Redis transport), `RABBITMQ_URL` (default: no
 * `payment.succeeded` consumer), `PAYMENT_QUEUE` (default `payment.succeeded`),
 * `PAYMENT_DEAD_LETTER_QUEUE` (default: none; rejected payment messages go there),
 * `IDEMPOTENCY_LEASE_SECONDS` (default 5; the guard renews the claim while a handler runs) and
 * `ADMIN_TOKEN` (default: none, the admin routes answer 404; with it they want it in `X-Admin-Token`).
 */
async function bootstrap(): Promise<void> {
  const port = portFromEnv('PORT', 3000);
  const adapter = adapterFromEnv();
  const host = process.env.HOST || '127.0.0.1';
  const redisUrl = process.env.REDIS_URL || undefined;
  const rabbitmqUrl = process.env.RABBITMQ_URL || undefined;
  const paymentQueue = process.env.PAYMENT_QUEUE || undefined;
  const paymentDeadLetterQueue = process.env.PAYMENT_DEAD_LETTER_QUEUE || undefined;
  const leaseSeconds = process.env.IDEMPOTENCY_LEASE_SECONDS ? Number(process.env.IDEMPOTENCY_LEASE_SECONDS) : undefined;
  const adminToken = process.env.ADMIN_TOKEN || undefined;

  let embedded: EmbeddedDatabase | undefined;
  let databaseUrl = process.env.DATABASE_URL;
  if (!databaseUrl) {
    // Imported only here: the package hooks process signals and exit as soon as it loads.
    const { startEmbeddedDatabase } = await import('./embedded-database.js');
    embedded = await startEmbeddedDatabase();
    databaseUrl = embedded.url;
  }

  let app: INestApplication | undefined;
  let closing: Promise<void> | undefined;
  const shutdown = (reason: string) =>
    (closing ??= (async () => {
      logger.log(`Shutting down (${reason})`);
      try {
        await app?.close();
      } finally {
        await embedded?.stop();
      }
    })());
  for (const signal of ['SIGINT', 'SIGTERM'] as const) {
    process.once(signal, () => {
      void shutdown(signal).then(
        () => process.exit(0),
        (error: unknown) => {
          logger.error('Shutdown failed', error instanceof Error ? error.stack : String(error));
          process.exit(1);
        },
      );
    });
  }

  try {
    app = await createDemoApp({ adapter, databaseUrl, redisUrl, rpcRedisUrl: redisUrl, rabbitmqUrl, paymentQueue, paymentDeadLetterQueue, leaseSeconds, adminToken });
    // One rule for both adapters (Express alone would listen on every interface).
    await app.listen(port, host);
  } catch (error) {
    await shutdown('startup failed');
    throw error;
  }
  const url = await app.getUrl();
  const summary = [
    `Demo (${adapter}) listening on ${url}  (PORT, HOST; HTTP_ADAPTER=express|fastify)`,
    `  API docs      ${url}/docs`,
    `  metrics       ${url}/metrics`,
    `  health        ${url}/health`,
    `  database      ${redactUrl(databaseUrl)}${embedded ? ' (embedded; set DATABASE_URL for your own)' : '  (DATABASE_URL)'}`,
    `  idempotency   ${redisUrl ? `Redis ${redactUrl(redisUrl)}  (REDIS_URL)` : 'memory store, one process only  (set REDIS_URL for Redis)'}`,
    `  payments      ${rabbitmqUrl ? `RabbitMQ ${redactUrl(rabbitmqUrl)}  (RABBITMQ_URL)` : 'no consumer  (set RABBITMQ_URL for the payment.succeeded consumer)'}`,
    `  lease         ${leaseSeconds ?? 5} s, renewed while a handler runs  (IDEMPOTENCY_LEASE_SECONDS)`,
    `  admin         ${adminToken ? `${url}/admin/idempotency, X-Admin-Token  (ADMIN_TOKEN)` : 'off, 404  (set ADMIN_TOKEN to turn it on)'}`,
  ];
  logger.log(summary.join('\n'));
}

bootstrap().catch((error: unknown) => {
  // The embedded database's failures say what to change; a stack would only hide that.
  const known = error instanceof Error && error.name === 'EmbeddedDatabaseError';
  logger.error(error instanceof Error ? (known ? error.message : error.stack ?? error.message) : String(error));
  process.exit(1);
});
