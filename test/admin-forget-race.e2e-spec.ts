// Operators' forgets racing real parallel requests of the same key, on every store
// (memory, Redis, Redis behind the local cache, PostgreSQL), through IdempotencyAdmin. A forget
// may only ever delete a completed record: the handler must never run twice at once, a forget
// of a running request is refused, and every answer is a 201, a replay or a 409.
import { afterAll, beforeAll, describe, expect, it } from '@jest/globals';
import { Body, Controller, Post, type INestApplication } from '@nestjs/common';
import { randomUUID } from 'node:crypto';
import type { DataSource } from 'typeorm';
import { IdempotencyAdmin, NoRepeatSubmit, type IdempotencyModuleOptions } from 'nestjs-idempotency';
import { IDEMPOTENCY_ENTITIES, IDEMPOTENCY_MIGRATIONS, PostgresIdempotencyStore } from 'nestjs-idempotency/typeorm';
import { REDIS_URL } from './support/services.js';
import { dropSchemaDataSource, openSchemaDataSource, testSchemaName } from './support/test-schema.js';
import { makeApp } from './support/edge-app.js';

const running = new Map<string, number>();
const overlaps: string[] = [];
const runs = new Map<string, number>();

@Controller('race')
class RaceController {
  @Post()
  @NoRepeatSubmit({ expireSeconds: 600 })
  async create(@Body() body: { k: string }) {
    const now = (running.get(body.k) ?? 0) + 1;
    running.set(body.k, now);
    if (now > 1) overlaps.push(`${body.k}: ${now} runs at once`);
    const run = (runs.get(body.k) ?? 0) + 1;
    runs.set(body.k, run);
    await new Promise((resolve) => setTimeout(resolve, 20));
    running.set(body.k, running.get(body.k)! - 1);
    return { k: body.k, run };
  }
}

type StoreName = 'memory' | 'redis' | 'redis + localCache' | 'postgres';
const cases: ['express' | 'fastify', StoreName][] = [
  ['express', 'memory'],
  ['fastify', 'redis'],
  ['express', 'redis + localCache'],
  ['fastify', 'postgres'],
];

describe.each(cases)('forgets racing requests of one key (%s, %s)', (adapter, storeName) => {
  let app: INestApplication;
  let url: string;
  let admin: IdempotencyAdmin;
  let dataSource: DataSource | undefined;

  beforeAll(async () => {
    const keyPrefix = `rvfr${randomUUID().slice(0, 8)}`;
    let options: IdempotencyModuleOptions = { keyPrefix };
    if (storeName === 'redis') options = { ...options, store: { redis: REDIS_URL } };
    if (storeName === 'redis + localCache') options = { ...options, store: { redis: REDIS_URL }, localCache: true };
    if (storeName === 'postgres') {
      dataSource = await openSchemaDataSource(testSchemaName(), { entities: IDEMPOTENCY_ENTITIES, migrations: IDEMPOTENCY_MIGRATIONS, migrationsRun: true });
      options = { ...options, store: new PostgresIdempotencyStore(dataSource) };
    }
    ({ app, url } = await makeApp(adapter, [RaceController], options));
    admin = app.get(IdempotencyAdmin);
  });
  afterAll(async () => {
    await app?.close();
    await dropSchemaDataSource(dataSource);
  });

  it('never runs the handler twice at once; answers only 201, replays and 409; a forget of a running request is refused', async () => {
    const k = randomUUID();
    const answers = new Map<string, number>();
    const forgets = { forgotten: 0, in_progress: 0, absent: 0, not_a_record: 0 };
    let stop = false;
    const client = async () => {
      while (!stop) {
        const res = await fetch(`${url}/race`, {
          method: 'POST',
          headers: { 'content-type': 'application/json', 'idempotency-key': k },
          body: JSON.stringify({ k }),
        });
        const body = (await res.json()) as { code?: string };
        const label = `${res.status}${res.headers.get('idempotent-replayed') ? ' replay' : ''}${body.code ? ` ${body.code}` : ''}`;
        answers.set(label, (answers.get(label) ?? 0) + 1);
      }
    };
    const operator = async () => {
      while (!stop) {
        const result = await admin.forget({ user: { anonymous: true }, handler: 'RaceController.create', key: k });
        if (result.forgotten) forgets.forgotten++;
        else forgets[result.reason]++;
        await new Promise((resolve) => setTimeout(resolve, 5));
      }
    };
    const loops = [...Array.from({ length: 8 }, () => client()), operator(), operator()];
    // At least 2.5 s, then until both outcomes of a forget were seen (a loaded machine races less
    // in the same time), up to 20 s.
    const deadline = Date.now() + 20_000;
    await new Promise((resolve) => setTimeout(resolve, 2500));
    while ((forgets.forgotten === 0 || forgets.in_progress === 0) && Date.now() < deadline) {
      await new Promise((resolve) => setTimeout(resolve, 100));
    }
    stop = true;
    await Promise.all(loops);
    expect(overlaps.filter((x) => x.startsWith(k))).toEqual([]);
    const allowed = new Set(['201', '201 replay', '409 IDEMPOTENCY_IN_PROGRESS']);
    expect([...answers.keys()].filter((label) => !allowed.has(label))).toEqual([]);
    expect(forgets.forgotten).toBeGreaterThan(0);
    expect(forgets.in_progress).toBeGreaterThan(0);
    expect(forgets.not_a_record).toBe(0);
    // Every run but the first follows a forget.
    expect(runs.get(k)).toBeLessThanOrEqual(forgets.forgotten + 1);
  }, 40_000);
});
