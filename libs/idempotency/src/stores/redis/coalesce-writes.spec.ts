import { afterEach, beforeEach, describe, expect, it, jest } from '@jest/globals';
import { Redis } from 'ioredis';
import type { Socket } from 'node:net';
import { within } from '../../../../../test/support/eventually.js';
import { REDIS_URL } from '../../../../../test/support/services.js';
import { countSocketWrites } from '../../../../../test/support/socket-writes.js';
import { coalesceWrites, whenWritesSent } from './coalesce-writes.js';

describe('coalesceWrites', () => {
  let client: Redis;

  beforeEach(async () => {
    client = new Redis(REDIS_URL, { lazyConnect: true, maxRetriesPerRequest: 0 });
    coalesceWrites(client);
    await client.connect();
  });
  afterEach(async () => {
    jest.useRealTimers();
    client.disconnect();
  });

  it('sends the commands of one turn in one write', async () => {
    const writes = countSocketWrites(client.stream as Socket);
    expect(await Promise.all(Array.from({ length: 10 }, () => client.ping()))).toEqual(Array(10).fill('PONG'));
    expect(writes).toEqual([10]);
  });

  it("sends a command written while fake timers hold setImmediate, and every later one (a test's fake timers)", async () => {
    // A test that fakes timers while a request is in flight, then goes back to real ones without
    // running them: an uncork left to the fake setImmediate never ran, and the socket stayed
    // corked, every later command of the client waiting (the guard failing open on timeouts).
    jest.useFakeTimers();
    const during = client.ping();
    jest.useRealTimers();
    expect(await within(during)).toBe('PONG');
    expect(await within(client.ping())).toBe('PONG');
  });

  it('runs what waits for a turn\'s commands once they went out, and at once when none wait', async () => {
    const writes = countSocketWrites(client.stream as Socket);
    const order: string[] = [];
    whenWritesSent(client, () => order.push('nothing waiting'));
    const answered = client.ping();
    whenWritesSent(client, () => order.push(`after ${writes.length} write(s)`));
    expect(order).toEqual(['nothing waiting']);
    expect(await answered).toBe('PONG');
    expect(order).toEqual(['nothing waiting', 'after 1 write(s)']);
  });
});
