import type { INestApplication, LoggerService, LogLevel } from '@nestjs/common';
import { NestFactory } from '@nestjs/core';
import { ExpressAdapter, type NestExpressApplication } from '@nestjs/platform-express';
import { FastifyAdapter, type NestFastifyApplication } from '@nestjs/platform-fastify';
import { Transport, type MicroserviceOptions } from '@nestjs/microservices';
import { DocumentBuilder, SwaggerModule } from '@nestjs/swagger';
import { MAX_KEY_LENGTH } from 'nestjs-idempotency';
import { AppModule, type AppModuleOptions } from './app.module.js';
import { XML_MEDIA_TYPES } from './uploads/xml-body.guard.js';

/** Largest request body accepted, on both adapters: 1 MiB. */
export const BODY_LIMIT_BYTES = 1024 * 1024;

/**
 * Longest path parameter Fastify's router takes (its default, 100 characters, answers 414 to a
 * longer one): an idempotency key of `MAX_KEY_LENGTH` characters in the admin routes' path, each
 * a 4-byte UTF-8 character percent-encoded (12 characters). A longer key still reaches the route,
 * which answers 400 as on Express.
 */
export const MAX_PARAM_LENGTH = MAX_KEY_LENGTH * 12;

export type HttpAdapterName = 'express' | 'fastify';

/**
 * The app module's options (database, Redis, key prefix, RabbitMQ and its queue: tests isolate
 * themselves with their own key prefix and queue) plus how to serve it.
 */
export interface DemoAppOptions extends AppModuleOptions {
  adapter: HttpAdapterName;
  /** Also serve the `orders.create` message pattern over the Redis transport at this URL. */
  rpcRedisUrl?: string;
  /** Nest's logger option (e.g. `['error', 'warn']` in tests). Default: Nest's default logger. */
  logger?: LoggerService | LogLevel[] | false;
}

/**
 * Creates and initialises the demo app (`app.init()` done, Fastify `ready()` too), without
 * listening: call `app.listen()` or hand `app.getHttpServer()` to supertest.
 */
export async function createDemoApp(options: DemoAppOptions): Promise<INestApplication> {
  const module = AppModule.register(options);
  // XML uploads get their bytes as received (a raw parser: the body is a Buffer), the contract of
  // their content hash. No app-wide `rawBody`: neither the guard nor @ContentDigest needs it.
  const xmlBodyLimit = options.uploads?.bodyLimitBytes ?? BODY_LIMIT_BYTES;
  const appOptions = {
    // Throw start-up errors to the caller (Nest's default is process.exit(1)).
    abortOnError: false,
    ...(options.logger === undefined ? {} : { logger: options.logger }),
  };

  if (options.adapter === 'fastify') {
    const adapter = new FastifyAdapter({ bodyLimit: BODY_LIMIT_BYTES, routerOptions: { maxParamLength: MAX_PARAM_LENGTH } });
    const app = await NestFactory.create<NestFastifyApplication>(module, adapter, appOptions);
    app.useBodyParser(XML_MEDIA_TYPES, { bodyLimit: xmlBodyLimit });
    serveApiDocs(app);
    connectRpc(app, options.rpcRedisUrl);
    await initOrClose(app, async () => {
      await app.init();
      await app.getHttpAdapter().getInstance().ready();
      await app.startAllMicroservices();
    });
    return app;
  }

  const app = await NestFactory.create<NestExpressApplication>(module, new ExpressAdapter(), appOptions);
  // Registered before init(), so Nest does not add its default parsers (100 kB limit).
  app.useBodyParser('json', { limit: BODY_LIMIT_BYTES });
  app.useBodyParser('urlencoded', { limit: BODY_LIMIT_BYTES, extended: true });
  app.useBodyParser('raw', { type: XML_MEDIA_TYPES, limit: xmlBodyLimit });
  serveApiDocs(app);
  connectRpc(app, options.rpcRedisUrl);
  await initOrClose(app, async () => {
    await app.init();
    await app.startAllMicroservices();
  });
  return app;
}

/** The Redis transport for message handlers (`OrdersRpcController`), when a URL is given. */
function connectRpc(app: INestApplication, url: string | undefined): void {
  if (!url) return;
  // inheritAppConfig: the app's global guard, validation pipe and exception filter apply to messages too.
  app.connectMicroservice<MicroserviceOptions>({ transport: Transport.REDIS, options: rpcRedisOptions(url) }, { inheritAppConfig: true });
}

/**
 * The transport's connection, from the whole URL the store uses: its user, password, database
 * and TLS too (with the host and the port only, a Redis that asks for a password stopped the
 * demo at start-up: NOAUTH). Nest's Redis transport gives up on its connection at the first drop
 * unless told to retry: after a one-second restart of Redis the message pattern answered nothing
 * again (an adversarial helper). It retries every second, for as long as the app runs.
 */
function rpcRedisOptions(url: string) {
  const parsed = new URL(url);
  const db = Number(parsed.pathname.slice(1) || 0);
  return {
    host: parsed.hostname.replace(/^\[(.*)\]$/, '$1'),
    port: Number(parsed.port || 6379),
    ...(parsed.username && { username: decodeURIComponent(parsed.username) }),
    ...(parsed.password && { password: decodeURIComponent(parsed.password) }),
    ...(db > 0 && { db }),
    ...(parsed.protocol === 'rediss:' && { tls: {} }),
    retryAttempts: Number.MAX_SAFE_INTEGER,
    retryDelay: 1000,
  };
}

/**
 * OpenAPI at `/docs` (JSON at `/docs-json`). The idempotency guard documents the key header and
 * its 400/409/422/503 answers on every `@NoRepeatSubmit()` route by itself.
 */
function serveApiDocs(app: INestApplication): void {
  const config = new DocumentBuilder()
    .setTitle('Idempotency demo: orders, invoices, payments')
    .setDescription('An order service guarded by @NoRepeatSubmit(), with the database as the layer behind it.')
    .setVersion('0.1.0')
    .build();
  SwaggerModule.setup('docs', app, () => SwaggerModule.createDocument(app, config));
}

/**
 * Runs `init`; if it fails (e.g. RabbitMQ unreachable), closes what the app already opened (the
 * database pool, the Redis client) before rethrowing, so a failed start leaves nothing behind.
 */
async function initOrClose(app: INestApplication, init: () => Promise<unknown>): Promise<void> {
  try {
    await init();
  } catch (error) {
    await app.close().catch(() => undefined);
    throw error;
  }
}
