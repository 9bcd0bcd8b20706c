import { afterAll, beforeAll, beforeEach, describe, expect, it } from '@jest/globals';
import { randomUUID } from 'node:crypto';
import {
  BIG_BODY_BYTES,
  BINARY,
  EVERY_APP,
  createRealApp,
  outcome,
  recordText,
  send,
  type Answer,
  type RealApp,
  type SendOptions,
} from './support/real-app.js';

/** The headers a replay carries from the first answer (the module's default allowlist). */
const REPLAYED_HEADERS = ['content-type', 'location', 'etag', 'content-location', 'content-disposition', 'cache-control'];

/** The replay is the first answer again: status, allowlisted headers, the same bytes; only it is marked replayed. */
function expectSameAnswer(first: Answer, replay: Answer): void {
  const view = (answer: Answer) => ({
    status: answer.status,
    headers: Object.fromEntries(REPLAYED_HEADERS.map((name) => [name, answer.headers[name]])),
    // latin1 maps each byte to one character: exact, and the diff stays readable for JSON.
    body: answer.body.toString('latin1'),
  });
  expect(first.headers['idempotent-replayed']).toBeUndefined();
  expect(replay.headers['idempotent-replayed']).toBe('true');
  expect(view(replay)).toEqual(view(first));
}

describe.each(EVERY_APP)('a real app (%s, %s store)', (adapter, store) => {
  let real: RealApp;
  let key: string;
  const post = (path: string, options: SendOptions = {}) => send(real.url, `/api/v1/users${path}`, { as: 'alice', key, ...options });

  beforeAll(async () => {
    real = await createRealApp({ adapter, store });
  });
  afterAll(async () => real?.close());
  beforeEach(() => {
    real.probe.reset();
    key = randomUUID();
  });

  it('runs the handler once for 200 parallel identical requests; the rest get its answer replayed or 409', async () => {
    const body = { email: 'storm@example.com' };
    const answers = await Promise.all(Array.from({ length: 200 }, () => post('/invitations', { body })));
    const firsts = answers.filter((answer) => answer.status === 201 && answer.headers['idempotent-replayed'] === undefined);
    const tally: Record<string, number> = {};
    for (const answer of answers) {
      const shown = answer === firsts[0] ? 'first' : outcome(answer);
      tally[shown] = (tally[shown] ?? 0) + 1;
    }
    const allowed = ['first', '201 replayed', '409 IDEMPOTENCY_IN_PROGRESS'];
    const unexpected = Object.entries(tally).filter(([shown]) => !allowed.includes(shown));
    expect({ runs: real.probe.runs('invite'), firsts: firsts.length, unexpected }).toEqual({ runs: 1, firsts: 1, unexpected: [] });
    for (const answer of answers.filter((a) => a.headers['idempotent-replayed'] === 'true')) expectSameAnswer(firsts[0], answer);
  });

  it('replays the serialized user byte for byte; no answer and no record holds the @Exclude()d passwordHash', async () => {
    const body = { email: 'alice@example.com' };
    const first = await post('', { body });
    expect(first.status).toBe(201);
    expect(first.json()).toEqual({ data: { id: 'alice-1', email: 'alice@example.com' } });
    const replay = await post('', { body });
    expectSameAnswer(first, replay);
    // An adversarial helper (session 20): the replay dropped it, and a private answer went out
    // without `no-store`.
    expect(replay.headers['cache-control']).toBe('private, no-store');
    expect(replay.body.toString('latin1')).not.toMatch(/passwordHash|secret-hash/);
    const record = await real.store.get(real.storageKey('alice', 'create', key));
    expect(record?.state).toBe('completed');
    expect(recordText(record)).not.toMatch(/passwordHash|secret-hash/);
    expect(real.probe.runs('create')).toBe(1);
  });

  it('replays through the global response-mapping interceptor once: { data } is not wrapped twice', async () => {
    const body = { email: 'bob@example.com' };
    const first = await post('/invitations', { body });
    const replay = await post('/invitations', { body });
    expect(first.json()).toEqual({ data: { invited: 'bob@example.com', run: 1 } });
    expect(replay.json()).toEqual(first.json());
    expect(replay.headers['idempotent-replayed']).toBe('true');
    expect(real.probe.runs('invite')).toBe(1);
  });

  it('replays what the first client got from a multi-value Observable (the last value)', async () => {
    const first = await post('/events');
    expect(first.json()).toEqual({ data: { seq: 3, run: 1 } });
    const replay = await post('/events');
    expectSameAnswer(first, replay);
    expect(real.probe.runs('events')).toBe(1);
  });

  it('replays a 204 as a 204 with no body', async () => {
    const first = await post('/purge');
    expect(first.status).toBe(204);
    const replay = await post('/purge');
    expect({ status: replay.status, bytes: replay.body.length, replayed: replay.headers['idempotent-replayed'] }).toEqual({
      status: 204,
      bytes: 0,
      replayed: 'true',
    });
    expect(real.probe.runs('purge')).toBe(1);
  });

  it('replays a 204 set at run time as a 204 with no body (not a 500)', async () => {
    const first = await post('/purge-now');
    expect(first.status).toBe(204);
    const replay = await post('/purge-now');
    expect({ status: replay.status, bytes: replay.body.length, replayed: replay.headers['idempotent-replayed'] }).toEqual({
      status: 204,
      bytes: 0,
      replayed: 'true',
    });
    expect(real.probe.runs('purgeNow')).toBe(1);
  });

  it('replays a returned Buffer holding NUL and non-UTF-8 bytes byte for byte', async () => {
    const first = await post('/avatar');
    expect(first.status).toBe(201);
    // Fastify sends the bytes; Nest's Express adapter sends a Buffer as JSON: either way, the same again.
    if (adapter === 'fastify') expect(first.body.equals(BINARY)).toBe(true);
    const replay = await post('/avatar');
    expectSameAnswer(first, replay);
    expect(real.probe.runs('avatar')).toBe(1);
  });

  it('replays a StreamableFile of NUL and non-UTF-8 bytes byte for byte', async () => {
    const first = await post('/avatar-file');
    expect(first.status).toBe(201);
    expect(first.body.equals(BINARY)).toBe(true);
    expect(first.headers['content-disposition']).toBe('attachment; filename="avatar.bin"');
    const replay = await post('/avatar-file');
    expectSameAnswer(first, replay);
    expect(real.probe.runs('avatarFile')).toBe(1);
  });

  it('sends a 2 MiB answer whole, saves no body over the bound and answers its duplicate 409 NOT_REPLAYABLE', async () => {
    const first = await post('/export');
    expect(first.status).toBe(201);
    expect(first.json().data.blob).toHaveLength(BIG_BODY_BYTES);
    const duplicate = await post('/export');
    expect({ duplicate: outcome(duplicate), runs: real.probe.runs('export') }).toEqual({
      duplicate: '409 IDEMPOTENCY_RESPONSE_NOT_REPLAYABLE',
      runs: 1,
    });
    const record = await real.store.get(real.storageKey('alice', 'export', key));
    expect(record?.state).toBe('completed');
    expect(recordText(record).length).toBeLessThan(64 * 1024);
  });

  it.each([
    ['a trailing slash', '/api/v1/users/invitations/'],
    ['upper case', '/API/V1/USERS/INVITATIONS'],
  ])('takes a retry to the route spelled with %s as the same request: a replay, not 422', async (_spelling, path) => {
    const body = { email: 'carol@example.com' };
    const first = await post('/invitations', { body });
    expect(first.status).toBe(201);
    const retry = await send(real.url, path, { as: 'alice', key, body });
    expect(retry.status).not.toBe(404); // the app's router takes this spelling (Fastify: ignoreTrailingSlash, caseSensitive: false)
    expect({ retry: outcome(retry), runs: real.probe.runs('invite') }).toEqual({ retry: '201 replayed', runs: 1 });
    expect(retry.body.equals(first.body)).toBe(true);
  });
});
