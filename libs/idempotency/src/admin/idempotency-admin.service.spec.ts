import { afterAll, afterEach, beforeAll, describe, expect, it, jest } from '@jest/globals';
import {
  Controller,
  Injectable,
  Logger,
  Post,
  type CanActivate,
  type ExecutionContext,
  type INestApplication,
} from '@nestjs/common';
import { APP_GUARD } from '@nestjs/core';
import { Test } from '@nestjs/testing';
import request from 'supertest';
import { NoRepeatSubmit } from '../decorators/no-repeat-submit.decorator.js';
import { Redis } from 'ioredis';
import { randomUUID } from 'node:crypto';
import { connectRedis } from '../../../../test/support/services.js';
import { IdempotencyError, IdempotencyStoreError } from '../errors/idempotency.errors.js';
import type { ResolvedIdempotencyOptions } from '../idempotency.config.js';
import { IdempotencyModule } from '../idempotency.module.js';
import { buildStorageKey } from '../keys/storage-key.js';
import { IdempotencyStore, type ClaimResult, type StoredRecord } from '../stores/idempotency-store.js';
import { MemoryIdempotencyStore } from '../stores/memory/memory-idempotency.store.js';
import { RedisIdempotencyStore } from '../stores/redis/redis-idempotency.store.js';
import { IdempotencyAdmin, type IdempotencyRecordRef } from './idempotency-admin.service.js';

/** Lets a test hold handler runs until it opens the gate. */
let gate: Promise<void> = Promise.resolve();
let runs = 0;

@Controller('pay')
class PaymentsController {
  @Post()
  @NoRepeatSubmit()
  async pay() {
    runs++;
    await gate;
    return { ok: true };
  }

  @Post('big')
  @NoRepeatSubmit({ maxResponseBytes: 4 })
  big() {
    return { more: 'than four bytes' };
  }
}

/** `request.user = { id: 42 }` (a number, as many auth layers give) when `x-user` is sent. */
@Injectable()
class NumericUserGuard implements CanActivate {
  canActivate(ctx: ExecutionContext): boolean {
    const req = ctx.switchToHttp().getRequest<{ headers: Record<string, string>; user?: { id: number } }>();
    if (req.headers['x-user']) req.user = { id: Number(req.headers['x-user']) };
    return true;
  }
}

// A client key with what the storage key encodes (':', '%', '{', '/').
const KEY = 'k:1/%{x}';
const HANDLER = 'PaymentsController.pay';

describe('IdempotencyAdmin', () => {
  let app: INestApplication;
  let admin: IdempotencyAdmin;
  let store: MemoryIdempotencyStore;
  const post = (path: string, key: string, user?: string) => {
    const call = request(app.getHttpServer()).post(path).set('idempotency-key', key);
    return user ? call.set('x-user', user) : call;
  };

  beforeAll(async () => {
    store = new MemoryIdempotencyStore();
    const moduleRef = await Test.createTestingModule({
      imports: [IdempotencyModule.forRoot({ store, keyPrefix: 'adm', leaseSeconds: 30 })],
      controllers: [PaymentsController],
      providers: [{ provide: APP_GUARD, useClass: NumericUserGuard }],
    }).compile();
    app = moduleRef.createNestApplication({ logger: false });
    await app.init();
    admin = app.get(IdempotencyAdmin);
  });
  afterAll(async () => app.close());
  afterEach(() => {
    jest.restoreAllMocks();
    gate = Promise.resolve();
  });

  it('finds the record the guard made for a user id, by (user, handler, key) under the module keyPrefix, and by its storage key', async () => {
    expect((await post('/pay', KEY, '42')).status).toBe(201);
    const storageKey = buildStorageKey({ prefix: 'adm', user: { id: '42' }, handler: HANDLER, key: KEY });
    const inspection = await admin.inspect({ user: 42, handler: HANDLER, key: KEY });
    expect(inspection).toEqual({
      storageKey,
      state: 'completed',
      statusCode: 201,
      replayable: true,
      bodyBytes: Buffer.byteLength('{"ok":true}'),
      headerNames: ['content-type', 'etag'],
      retentionLeftMs: expect.any(Number),
      expiresAt: expect.any(Date),
      fingerprinted: true,
    });
    // Never the fingerprint: a SHA-256 of the request tells a small body to whoever tries candidates.
    expect(JSON.stringify(inspection)).not.toMatch(/[0-9a-f]{64}/);
    expect(inspection.state === 'completed' && inspection.retentionLeftMs).toBeGreaterThan(3_500_000);
    // The same record by a string user id, by the storage key as a string and as `{ storageKey }`.
    const same = { storageKey, state: 'completed', statusCode: 201, fingerprinted: true };
    expect(await admin.inspect({ user: '42', handler: HANDLER, key: KEY })).toMatchObject(same);
    expect(await admin.inspect(storageKey)).toMatchObject(same);
    expect(await admin.inspect({ storageKey })).toMatchObject(same);
    // Another user's key of the same name is another record.
    expect(await admin.inspect({ user: 43, handler: HANDLER, key: KEY })).toMatchObject({ state: 'absent' });
  });

  it('finds an anonymous caller\'s record in the shared namespace', async () => {
    expect((await post('/pay', 'anon-key')).status).toBe(201);
    expect(await admin.inspect({ user: { anonymous: true }, handler: HANDLER, key: 'anon-key' })).toMatchObject({
      storageKey: 'adm:anon::PaymentsController.pay:anon-key',
      state: 'completed',
    });
  });

  it('forgets a completed record, logging it: the same key runs the handler again', async () => {
    const log = jest.spyOn(Logger.prototype, 'log').mockImplementation(() => undefined);
    expect((await post('/pay', 'again', '42')).status).toBe(201);
    expect((await post('/pay', 'again', '42')).headers['idempotent-replayed']).toBe('true');
    const before = runs;
    const storageKey = admin.storageKeyOf({ user: 42, handler: HANDLER, key: 'again' });
    expect(await admin.forget({ user: 42, handler: HANDLER, key: 'again' })).toEqual({ storageKey, forgotten: true });
    expect(log).toHaveBeenCalledWith(expect.stringContaining(`forgot the completed record ${storageKey}`));
    const rerun = await post('/pay', 'again', '42');
    expect(rerun.status).toBe(201);
    expect(rerun.headers['idempotent-replayed']).toBeUndefined();
    expect(runs).toBe(before + 1);
  });

  it('describes a request in progress and refuses to forget it; the request then completes', async () => {
    let open!: () => void;
    gate = new Promise((resolve) => (open = resolve));
    const running = post('/pay', 'slow', '42').then((res) => res);
    const ref = { user: 42, handler: HANDLER, key: 'slow' };
    const deadline = Date.now() + 5000;
    while ((await admin.inspect(ref)).state !== 'in_progress' && Date.now() < deadline) await new Promise((r) => setTimeout(r, 5));
    const inspection = await admin.inspect(ref);
    expect(inspection).toMatchObject({ state: 'in_progress', fingerprinted: true });
    expect(JSON.stringify(inspection)).not.toMatch(/[0-9a-f]{64}/);
    expect(inspection.state === 'in_progress' && inspection.leaseLeftMs).toBeGreaterThan(0);
    expect(inspection.state === 'in_progress' && inspection.leaseLeftMs).toBeLessThanOrEqual(30_000);
    expect(await admin.forget(ref)).toEqual({ storageKey: inspection.storageKey, forgotten: false, reason: 'in_progress' });
    expect((await post('/pay', 'slow', '42')).status).toBe(409);
    open();
    expect((await running).status).toBe(201);
    expect(await admin.inspect(ref)).toMatchObject({ state: 'completed', statusCode: 201 });
  });

  it('says when the saved answer is not replayable, and why', async () => {
    expect((await post('/pay/big', 'big', '42')).status).toBe(201);
    expect(await admin.inspect({ user: 42, handler: 'PaymentsController.big', key: 'big' })).toMatchObject({
      state: 'completed',
      statusCode: 201,
      replayable: false,
      unreplayable: 'too_large',
      bodyBytes: 0,
    });
  });

  it('answers absent for a key nobody used, for inspect and forget alike, and logs nothing', async () => {
    const log = jest.spyOn(Logger.prototype, 'log').mockImplementation(() => undefined);
    const ref = { user: 42, handler: HANDLER, key: 'never' };
    expect(await admin.inspect(ref)).toEqual({ storageKey: 'adm:42:PaymentsController.pay:never', state: 'absent' });
    expect(await admin.forget(ref)).toEqual({ storageKey: 'adm:42:PaymentsController.pay:never', forgotten: false, reason: 'absent' });
    expect(log).not.toHaveBeenCalled();
  });

  it('keys a message handler\'s record by the empty user, and refuses a user id the guard never keys by', () => {
    expect(admin.storageKeyOf({ user: '', handler: 'OrdersRpc.create', key: 'm-1' })).toBe('adm::OrdersRpc.create:m-1');
    expect(admin.storageKeyOf({ user: { ip: '::1' }, handler: HANDLER, key: 'a' })).toBe('adm:ip:%3A%3A1:PaymentsController.pay:a');
    // A call keyed by its fingerprint, apart from a client key that spells it.
    const fingerprint = 'ab12'.repeat(16);
    // A number, as the guard keys a #body number (helper-204: refused by the first check).
    expect(admin.storageKeyOf({ user: 42, handler: HANDLER, key: 42 as unknown as string })).toBe('adm:42:PaymentsController.pay:42');
    expect(admin.storageKeyOf({ user: 42, handler: HANDLER, fingerprint })).toBe(`adm:42:PaymentsController.pay:fp=${fingerprint}`);
    expect(admin.storageKeyOf({ user: 42, handler: HANDLER, key: fingerprint })).toBe(`adm:42:PaymentsController.pay:${fingerprint}`);
    // No record the guard keeps (helper-197: fp=undefined, an empty segment, or the fingerprint of the two, in silence).
    for (const ref of [
      { fingerprint: undefined as unknown as string },
      { fingerprint: '' },
      { fingerprint: 'ab12' },
      { key: '' },
      { key: 'a\u0000b' },
      { key: Number.NaN as unknown as string },
      { key: {} as unknown as string },
      { key: 'k', fingerprint },
    ]) {
      expect(() => admin.storageKeyOf({ user: 42, handler: HANDLER, ...ref } as IdempotencyRecordRef)).toThrow(IdempotencyError);
    }
    expect(() => admin.storageKeyOf({ user: Number.NaN, handler: HANDLER, key: 'a' })).toThrow(IdempotencyError);
    // The parts of a user id, as a getUser giving [tenantId, sub] keys them; a missing part is no user.
    expect(admin.storageKeyOf({ user: ['t1', 42], handler: HANDLER, key: 'a' })).toBe('adm:t1,42:PaymentsController.pay:a');
    expect(admin.storageKeyOf({ user: ['t1'], handler: HANDLER, key: 'a' })).toBe('adm:t1:PaymentsController.pay:a');
    expect(() => admin.storageKeyOf({ user: ['t1', ''], handler: HANDLER, key: 'a' })).toThrow(IdempotencyError);
    expect(admin.storageKeyOf({ user: { parts: ['t1', '42'] }, handler: HANDLER, key: 'a' })).toBe('adm:t1,42:PaymentsController.pay:a');
    // One part is a plain id, and no part is no user: never the key of another (the review of session 21).
    expect(() => admin.storageKeyOf({ user: { parts: ['a'] }, handler: HANDLER, key: 'a' })).toThrow(IdempotencyError);
    expect(() => admin.storageKeyOf({ user: { parts: [] }, handler: HANDLER, key: 'a' })).toThrow(IdempotencyError);
    // A user the guard keyed because its user object held the text (nan_li@acme.io) is named as it is.
    expect(admin.storageKeyOf({ user: 'nan_li@acme.io', handler: HANDLER, key: 'a' })).toBe('adm:nan_li%40acme.io:PaymentsController.pay:a');
  });
});

describe('IdempotencyAdmin on a Redis the app shares', () => {
  let client: Redis;
  let admin: IdempotencyAdmin;
  const options = { keyPrefix: 'adm' } as ResolvedIdempotencyOptions;
  beforeAll(async () => {
    client = await connectRedis();
    admin = new IdempotencyAdmin(new RedisIdempotencyStore(client), options);
  });
  afterAll(async () => {
    await client.quit();
  });

  it('answers not_a_record, as a value, to a key that holds the app\'s own string or hash, and leaves it as it was', async () => {
    const [text, hash] = [`adm:app:${randomUUID()}`, `adm:app-hash:${randomUUID()}`];
    await client.set(text, 'Canada', 'PX', 60_000);
    await client.hset(hash, 'a', '1');
    await client.pexpire(hash, 60_000);
    for (const storageKey of [text, hash]) {
      expect(await admin.inspect(storageKey)).toEqual({ storageKey, state: 'not_a_record' });
      expect(await admin.forget({ storageKey })).toEqual({ storageKey, forgotten: false, reason: 'not_a_record' });
    }
    expect(await client.get(text)).toBe('Canada');
    expect(await client.hgetall(hash)).toEqual({ a: '1' });
  });

  it('still throws when the store cannot answer: only a key that holds something else is a value', async () => {
    const down = new Redis({ port: 1, lazyConnect: true, maxRetriesPerRequest: 0, enableOfflineQueue: false, retryStrategy: () => null });
    down.on('error', () => undefined);
    const offline = new IdempotencyAdmin(new RedisIdempotencyStore(down), options);
    await expect(offline.inspect('adm:x')).rejects.toBeInstanceOf(IdempotencyStoreError);
    await expect(offline.forget('adm:x')).rejects.toBeInstanceOf(IdempotencyStoreError);
    down.disconnect();
  });
});

describe('a store written before forget existed', () => {
  class OldStore extends IdempotencyStore {
    claim = async (): Promise<ClaimResult> => ({ status: 'mismatch' });
    complete = async () => false;
    release = async () => false;
    renew = async () => false;
    get = async (): Promise<StoredRecord | undefined> => undefined;
  }

  it('compiles, and its forget says what it lacks', async () => {
    await expect(new OldStore().forget('k')).rejects.toThrow('OldStore cannot forget a record: implement IdempotencyStore.forget(key)');
  });
});
