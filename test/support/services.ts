import { Redis, type RedisOptions } from 'ioredis';
import pg from 'pg';

/** The services the tests use: the local ones unless REDIS_URL / DATABASE_URL say otherwise. */
export const REDIS_URL = process.env.REDIS_URL ?? 'redis://127.0.0.1:6379';
export const DATABASE_URL = process.env.DATABASE_URL ?? 'postgres://postgres@127.0.0.1:5432/test';
export const RABBITMQ_URL = process.env.RABBITMQ_URL ?? 'amqp://guest:guest@127.0.0.1:5672';

/**
 * Redis options for a spec about something other than store latency: on a loaded CI machine a
 * command can take longer than the module's 1 s default, and the guard rightly answers that as
 * an outage (503 fail-closed, 409 while a failed save is retried), which such a spec did not ask.
 */
export function patientRedis(url = REDIS_URL): { host: string; port: number; commandTimeout: number } {
  const { hostname, port } = new URL(url);
  return { host: hostname, port: Number(port || 6379), commandTimeout: 15_000 };
}

/** A Redis client that fails fast (no retries, short timeouts) with a message naming the URL. */
export async function connectRedis(url = REDIS_URL, options: RedisOptions = {}): Promise<Redis> {
  const client = new Redis(url, {
    lazyConnect: true,
    maxRetriesPerRequest: 0,
    connectTimeout: 1000,
    commandTimeout: 2000,
    retryStrategy: () => null,
    ...options,
  });
  client.on('error', () => undefined);
  try {
    await client.connect();
    await client.ping();
  } catch (error) {
    client.disconnect();
    throw new Error(`Redis is not reachable at ${url} (set REDIS_URL): ${(error as Error).message}`);
  }
  return client;
}

/** Checks PostgreSQL answers, with a message naming the URL. */
export async function checkPostgres(url = DATABASE_URL): Promise<void> {
  const client = new pg.Client({ connectionString: url, connectionTimeoutMillis: 2000 });
  try {
    await client.connect();
    await client.query('select 1');
  } catch (error) {
    throw new Error(`PostgreSQL is not reachable at ${url} (set DATABASE_URL): ${(error as Error).message}`);
  } finally {
    await client.end().catch(() => undefined);
  }
}

/** Checks the AMQP broker accepts a connection, with a message naming the URL (password hidden). */
export async function checkRabbitMq(url = RABBITMQ_URL): Promise<void> {
  const { connect } = await import('amqplib');
  try {
    const connection = await connect(url, { timeout: 2000 });
    await connection.close();
  } catch (error) {
    const shown = url.replace(/\/\/([^:@/]+):[^@/]*@/, '//$1:***@');
    throw new Error(`RabbitMQ is not reachable at ${shown} (set RABBITMQ_URL): ${(error as Error).message}`);
  }
}

/** Jest global setup: fails the whole run at once, naming the URL, when a service is down. */
export default async function checkServices(): Promise<void> {
  const redis = await connectRedis();
  redis.disconnect();
  await checkPostgres();
  await checkRabbitMq();
}
