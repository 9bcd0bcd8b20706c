// A storm of duplicates on the PostgreSQL store: every duplicate's claim waits in the pool's
// queue, first come first served, and a held claim's renewal waited behind them all. On a slow
// database the renewals missed the lease, the claims were lost while their handlers ran, and
// the duplicates took the keys and ran them again (an adversarial helper: 2 to 6 runs for 29 of
// 50 keys, two instances, a pool of 10, a 1 s lease, a database just restarted). Handlers here
// hold no connection: the claims alone fill the queue. Every statement here is slowed by a
// proxy, as a cold or loaded database would be.
import { afterAll, beforeAll, describe, expect, it } from '@jest/globals';
import { Controller, Headers, Post } from '@nestjs/common';
import { randomUUID } from 'node:crypto';
import { DataSource } from 'typeorm';
import { NoRepeatSubmit } from '../libs/idempotency/src/index.js';
import { IDEMPOTENCY_ENTITIES, IDEMPOTENCY_MIGRATIONS, PostgresIdempotencyStore } from '../libs/idempotency/src/typeorm/index.js';
import { makeApp, send, sleep, type EdgeApp } from './support/edge-app.js';
import { DATABASE_URL } from './support/services.js';
import { TcpProxy } from './support/tcp-proxy.js';
import { dropSchemaDataSource, openSchemaDataSource, testSchemaName } from './support/test-schema.js';

const runsOf = new Map<string, number>();

@Controller('shipments')
class ShipmentsController {
  @Post()
  @NoRepeatSubmit({ leaseSeconds: 1 })
  async ship(@Headers('idempotency-key') key: string) {
    runsOf.set(key, (runsOf.get(key) ?? 0) + 1);
    await sleep(2500); // two and a half leases: renewed twice or more
    return { shipped: key };
  }
}

describe('renewals during a storm of duplicates (PostgreSQL store, a slow database, pool of 4)', () => {
  const schema = testSchemaName();
  let setup: DataSource;
  let ds: DataSource;
  let proxy: TcpProxy;
  let app: EdgeApp;

  beforeAll(async () => {
    setup = await openSchemaDataSource(schema, { entities: IDEMPOTENCY_ENTITIES, migrations: IDEMPOTENCY_MIGRATIONS, migrationsRun: true, extra: { max: 1 } });
    const target = new URL(DATABASE_URL);
    proxy = await new TcpProxy({ host: target.hostname, port: Number(target.port || 5432) }).start();
    const url = new URL(DATABASE_URL);
    url.port = String(proxy.port);
    ds = new DataSource({ type: 'postgres', url: url.toString(), schema, entities: IDEMPOTENCY_ENTITIES, extra: { max: 4 } });
    await ds.initialize();
    app = await makeApp('express', [ShipmentsController], { store: new PostgresIdempotencyStore(ds), keyPrefix: 'renewal-priority' });
    app.app.useLogger(false);
  });
  afterAll(async () => {
    await app?.close();
    await ds?.destroy();
    await proxy?.stop();
    await dropSchemaDataSource(setup);
  });

  it('keeps each held claim: every key runs once', async () => {
    const keys = Array.from({ length: 10 }, () => randomUUID());
    const firsts = keys.map((key) => send(app.url, '/shipments', { key, timeoutMs: 30_000 }));
    await sleep(200); // the first claims landed
    proxy.delayMs = 15; // each statement now takes ~30 ms: 4 connections answer ~130 a second
    // 12 clients per key retry their duplicate while it is in progress, 50 ms apart.
    const duplicate = async (key: string) => {
      for (let attempt = 0; attempt < 200; attempt++) {
        const answer = await send(app.url, '/shipments', { key, timeoutMs: 30_000 });
        if (answer.status !== 409) return answer.status;
        await sleep(50);
      }
      return 409;
    };
    const storm = keys.flatMap((key) => Array.from({ length: 12 }, () => duplicate(key)));
    expect((await Promise.all(firsts)).map((answer) => answer.status)).toEqual(keys.map(() => 201));
    await Promise.all(storm);
    proxy.delayMs = 0;
    expect(keys.filter((key) => runsOf.get(key) !== 1).map((key) => runsOf.get(key))).toEqual([]);
  });
});
