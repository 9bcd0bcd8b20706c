import { afterAll, beforeAll, beforeEach, describe, expect, it } from '@jest/globals';
import { randomUUID } from 'node:crypto';
import { EVERY_APP, createRealApp, outcome, send, type RealApp, type SendOptions } from './support/real-app.js';

/** The longest valid key: 255 code points, each 4 bytes in UTF-8 (and 2 UTF-16 units). */
const LONGEST_KEY = '\u{1F600}'.repeat(255);
/** A long `sub`, as some identity providers issue. */
const LONG_SUB = '\u{1F600}'.repeat(300);

describe.each(EVERY_APP)('a real app with JWT users (%s, %s store)', (adapter, store) => {
  let real: RealApp;
  let key: string;
  const post = (path: string, options: SendOptions = {}) => send(real.url, `/api/v1/users${path}`, { key, ...options });

  beforeAll(async () => {
    real = await createRealApp({ adapter, store });
  });
  afterAll(async () => real?.close());
  beforeEach(() => {
    real.probe.reset();
    key = randomUUID();
  });

  it('keeps two `sub` users behind one address apart: the same key runs once for each, and each gets their own answer', async () => {
    const body = { email: 'same@example.com' };
    const alice = await post('', { as: 'alice', body });
    const bob = await post('', { as: 'bob', body });
    const aliceAgain = await post('', { as: 'alice', body });
    const bobAgain = await post('', { as: 'bob', body });
    const seen = (answer: typeof alice) => `${outcome(answer)} ${answer.json()?.data?.id}`;
    expect({
      alice: seen(alice),
      bob: seen(bob),
      aliceAgain: seen(aliceAgain),
      bobAgain: seen(bobAgain),
      runs: real.probe.runs('create'),
    }).toEqual({
      alice: '201 alice-1',
      bob: '201 bob-2',
      aliceAgain: '201 replayed alice-1',
      bobAgain: '201 replayed bob-2',
      runs: 2,
    });
  });

  it('refuses a user with neither id nor sub with 500 IDEMPOTENCY_USER_UNRESOLVED, without running the handler', async () => {
    const answer = await post('', { as: 'nosub', body: { email: 'x@example.com' } });
    expect({ answer: outcome(answer), runs: real.probe.runs('create') }).toEqual({
      answer: '500 IDEMPOTENCY_USER_UNRESOLVED',
      runs: 0,
    });
  });

  it('answers an anonymous call without a key on a fingerprint route 400 IDEMPOTENCY_KEY_MISSING (anonymous: client-key)', async () => {
    const answer = await post('/lookup', { key: undefined, body: { email: randomUUID() } });
    expect({ answer: outcome(answer), runs: real.probe.runs('lookup') }).toEqual({
      answer: '400 IDEMPOTENCY_KEY_MISSING',
      runs: 0,
    });
  });

  it('guards anonymous calls that send a key: another anonymous client (another address) with that key gets the replay', async () => {
    const body = { email: 'anon@example.com' };
    const first = await post('/lookup', { body });
    const second = await post('/lookup', { body, from: '127.0.0.2' });
    expect({ first: outcome(first), second: outcome(second), runs: real.probe.runs('lookup') }).toEqual({
      first: '201',
      second: '201 replayed',
      runs: 1,
    });
    expect(second.body.equals(first.body)).toBe(true);
  });

  it('takes the longest valid key (255 four-byte characters) of a user with a long sub: one run, the duplicate replays', async () => {
    const body = { ref: LONGEST_KEY };
    const first = await post('/imports', { key: undefined, as: LONG_SUB, body });
    const duplicate = await post('/imports', { key: undefined, as: LONG_SUB, body });
    expect({ first: outcome(first), duplicate: outcome(duplicate), runs: real.probe.runs('import') }).toEqual({
      first: '201',
      duplicate: '201 replayed',
      runs: 1,
    });
    expect(first.json()).toEqual({ data: { importedBy: LONG_SUB.length, run: 1 } });
  });
});

describe.each(EVERY_APP)('a real app with anonymous: address (%s, %s store)', (adapter, store) => {
  let real: RealApp;

  beforeAll(async () => {
    real = await createRealApp({ adapter, store, idempotency: { anonymous: 'address' } });
  });
  afterAll(async () => real?.close());

  it('guards anonymous calls by address on a fingerprint route: two identical calls without a key run once', async () => {
    const body = { email: randomUUID() };
    const first = await send(real.url, '/api/v1/users/lookup', { body });
    const second = await send(real.url, '/api/v1/users/lookup', { body });
    const elsewhere = await send(real.url, '/api/v1/users/lookup', { body, from: '127.0.0.2' });
    expect({
      first: outcome(first),
      second: outcome(second),
      elsewhere: outcome(elsewhere),
      runs: real.probe.runs('lookup'),
    }).toEqual({ first: '201', second: '201 replayed', elsewhere: '201', runs: 2 });
  });
});
