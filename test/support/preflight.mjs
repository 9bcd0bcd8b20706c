#!/usr/bin/env node
// `npm test`, step 1: says what the run checks, then checks the services the tests need, all at
// once and quickly. A service that is down gets one line (its URL, how to start it) and the run
// stops here, before the type-check. A missing test database is created.
import { Redis } from 'ioredis';
import { mkdirSync, writeFileSync } from 'node:fs';
import pg from 'pg';

const REDIS_URL = process.env.REDIS_URL ?? 'redis://127.0.0.1:6379';
const DATABASE_URL = process.env.DATABASE_URL ?? 'postgres://postgres@127.0.0.1:5432/test';
const RABBITMQ_URL = process.env.RABBITMQ_URL ?? 'amqp://guest:guest@127.0.0.1:5672';
const TIMEOUT_MS = 2000;

/** A URL as it may be shown: the password hidden. */
const shown = (url) => url.replace(/\/\/([^:@/]+):[^@/]*@/, '//$1:***@');

async function checkPostgres() {
  const connect = async (url) => {
    const client = new pg.Client({ connectionString: url, connectionTimeoutMillis: TIMEOUT_MS });
    await client.connect();
    return client;
  };
  let client;
  try {
    client = await connect(DATABASE_URL);
  } catch (error) {
    // 3D000: the server answers, the database does not exist yet: create it.
    if (error.code !== '3D000') throw error;
    const url = new URL(DATABASE_URL);
    const database = decodeURIComponent(url.pathname.slice(1));
    url.pathname = '/postgres';
    const admin = await connect(url.href);
    try {
      await admin.query(`CREATE DATABASE ${admin.escapeIdentifier(database)}`);
      console.log(`  created the database "${database}"`);
    } finally {
      await admin.end();
    }
    client = await connect(DATABASE_URL);
  }
  await client.query('select 1').finally(() => client.end());
}

async function checkRedis() {
  const client = new Redis(REDIS_URL, { lazyConnect: true, maxRetriesPerRequest: 0, connectTimeout: TIMEOUT_MS, retryStrategy: () => null });
  client.on('error', () => undefined);
  try {
    await client.connect();
    await client.ping();
  } finally {
    client.disconnect();
  }
}

async function checkRabbitMq() {
  const { connect } = await import('amqplib');
  const connection = await connect(RABBITMQ_URL, { timeout: TIMEOUT_MS });
  await connection.close();
}

const SERVICES = [
  { name: 'PostgreSQL', url: DATABASE_URL, variable: 'DATABASE_URL', start: 'pg_ctlcluster <version> main start', check: checkPostgres },
  { name: 'Redis', url: REDIS_URL, variable: 'REDIS_URL', start: 'redis-server --daemonize yes', check: checkRedis },
  { name: 'RabbitMQ', url: RABBITMQ_URL, variable: 'RABBITMQ_URL', start: 'rabbitmq-server -detached', check: checkRabbitMq },
];

console.log(
  'npm test: checks the services (PostgreSQL, Redis, RabbitMQ), type-checks everything (tsc, ~20 s), ' +
    'then runs every spec with Jest on the real services (~7 min).',
);
const results = await Promise.all(
  SERVICES.map(async (service) => {
    try {
      await service.check();
      return undefined;
    } catch (error) {
      const why = (error.message || error.code || String(error)).split('\n')[0];
      return `${service.name} is down at ${shown(service.url)} (${why}): start it (e.g. \`${service.start}\`) or set ${service.variable}`;
    }
  }),
);
const down = results.filter(Boolean);
if (down.length > 0) {
  for (const line of down) console.error(line);
  process.exit(1);
}
console.log(`  services up: ${SERVICES.map((service) => service.name).join(', ')}`);
// The apps under test log here (test/support/app-logs.ts): one file per run.
const logs = new URL('../../.test-logs/', import.meta.url);
mkdirSync(logs, { recursive: true });
writeFileSync(new URL('apps.log', logs), '');
console.log('  the apps under test log to .test-logs/apps.log');
