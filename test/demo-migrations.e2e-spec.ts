import { describe, expect, it } from '@jest/globals';
import type { INestApplication } from '@nestjs/common';
import { randomUUID } from 'node:crypto';
import pg from 'pg';
import request from 'supertest';
import { DataSource } from 'typeorm';
import { createDemoApp } from '../apps/demo/src/demo-app.factory.js';
import { DATABASE_URL } from './support/services.js';

/**
 * The demo's schema comes from migrations only (no synchronize). Each test runs in a database of
 * its own, created and dropped here, so it sees exactly what a new or an old database looks like
 * (the shared `test` database has whatever earlier runs left). The HTTP adapter plays no part.
 */
const MIGRATIONS = [
  'IdempotencyRecords1764460800000',
  'IdempotencyConsumeLog1764460800001',
  'IdempotencyOutcomes1764547200000',
  'DemoOrders1795996800000',
  'DemoInvoices1795996800001',
  'IdempotencyResponseFlags1795996800002',
  'DemoXmlUploads1796083200000',
  'DemoPayments1796169600000',
];

async function admin<T>(work: (client: pg.Client) => Promise<T>, url = DATABASE_URL): Promise<T> {
  const client = new pg.Client({ connectionString: url, connectionTimeoutMillis: 2000 });
  await client.connect();
  try {
    return await work(client);
  } finally {
    await client.end();
  }
}

/** Runs `work` against a new, empty database, dropped afterwards. */
async function withNewDatabase(work: (url: string) => Promise<void>): Promise<void> {
  const name = `demo_migrations_${randomUUID().replaceAll('-', '')}`;
  await admin((client) => client.query(`CREATE DATABASE ${name}`));
  const url = new URL(DATABASE_URL);
  url.pathname = `/${name}`;
  try {
    await work(url.toString());
  } finally {
    await admin((client) => client.query(`DROP DATABASE ${name} WITH (FORCE)`));
  }
}

const start = (databaseUrl: string) => createDemoApp({ adapter: 'express', databaseUrl, logger: ['error'] });

async function executedMigrations(app: INestApplication): Promise<string[]> {
  const rows: { name: string }[] = await app.get(DataSource).query('select name from migrations order by id');
  return rows.map((row) => row.name);
}

/** The DDL TypeORM's `synchronize` would run to make the database match the entities. */
async function schemaDrift(app: INestApplication): Promise<string[]> {
  const sql = await app.get(DataSource).driver.createSchemaBuilder().log();
  return sql.upQueries.map((query) => query.query);
}

describe('the demo migrations', () => {
  it('build a new database that matches the entities, once', async () => {
    await withNewDatabase(async (url) => {
      const app = await start(url);
      try {
        expect(await executedMigrations(app)).toEqual(MIGRATIONS);
        expect(await schemaDrift(app)).toEqual([]);
        const orderNo = `MIG-${randomUUID()}`;
        await request(app.getHttpServer()).post('/orders').send({ orderNo, amount: 1 }).expect(201);
        const transactionId = 'T'.repeat(128);
        const paid = await request(app.getHttpServer())
          .post(`/orders/${orderNo}/payment-callback`)
          .send({ transactionId, paidAt: '2026-11-30T10:00:00Z' });
        expect([paid.status, paid.body.order?.transactionId]).toEqual([200, transactionId]);
      } finally {
        await app.close();
      }

      // A second start finds every migration done and runs none.
      const again = await start(url);
      try {
        expect(await executedMigrations(again)).toEqual(MIGRATIONS);
        expect(await again.get(DataSource).showMigrations()).toBe(false);
      } finally {
        await again.close();
      }
    });
  });

  it.each([
    [
      'made by synchronize with the payment columns',
      `CREATE TABLE orders (
        id uuid NOT NULL DEFAULT gen_random_uuid(), order_no varchar(64) NOT NULL, user_id varchar(64) NOT NULL,
        amount numeric(12,2) NOT NULL, status varchar(16) NOT NULL DEFAULT 'PENDING', created_at timestamptz NOT NULL DEFAULT now(),
        transaction_id varchar(64), paid_at timestamptz, version integer NOT NULL DEFAULT 1,
        CONSTRAINT "PK_710e2d4957aa5878dfe94e4ac2f" PRIMARY KEY (id));
      CREATE UNIQUE INDEX uq_orders_order_no ON orders (order_no)`,
    ],
    [
      'made by synchronize before the payment columns',
      `CREATE TABLE orders (
        id uuid NOT NULL DEFAULT gen_random_uuid(), order_no varchar(64) NOT NULL, user_id varchar(64) NOT NULL,
        amount numeric(12,2) NOT NULL, status varchar(16) NOT NULL DEFAULT 'PENDING', created_at timestamptz NOT NULL DEFAULT now(),
        CONSTRAINT "PK_710e2d4957aa5878dfe94e4ac2f" PRIMARY KEY (id))`,
    ],
  ])('adopt an orders table %s, keeping its rows', async (_what, ddl) => {
    await withNewDatabase(async (url) => {
      await admin(async (client) => {
        await client.query(ddl);
        await client.query(`INSERT INTO orders (order_no, user_id, amount) VALUES ('LEGACY-1', 'alice', 7.5)`);
      }, url);

      const app = await start(url);
      try {
        expect(await executedMigrations(app)).toEqual(MIGRATIONS);
        const http = () => request(app.getHttpServer());
        const legacy = await http().get('/orders/LEGACY-1').expect(200);
        expect(legacy.body).toMatchObject({ orderNo: 'LEGACY-1', userId: 'alice', amount: 7.5, status: 'PENDING', transactionId: null });

        // The columns the payment needs exist, with the new width.
        const transactionId = 'T'.repeat(128);
        const paid = await http().post('/orders/LEGACY-1/payment-callback').send({ transactionId, paidAt: '2026-11-30T10:00:00Z' });
        expect([paid.status, paid.body.order?.transactionId]).toEqual([200, transactionId]);
        // The unique index holds.
        await http().post('/orders').set('X-User-Id', 'bob').send({ orderNo: 'LEGACY-1', amount: 1 }).expect(409);
        // Nothing left for synchronize to do (TypeORM does not compare primary key names: the
        // adopted table keeps synchronize's "PK_710e...", a new one has "pk_orders").
        expect(await schemaDrift(app)).toEqual([]);
      } finally {
        await app.close();
      }
    });
  });
});
