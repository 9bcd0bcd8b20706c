import { afterEach, beforeEach, describe, expect, it, jest } from '@jest/globals';
import { Redis } from 'ioredis';
import type { Socket } from 'node:net';
import { REDIS_URL } from '../../../../../test/support/services.js';
import { coalesceWrites } from './coalesce-writes.js';

/** Counts the writes reaching the client's socket, and the commands each holds. */
function countWrites(client: Redis): number[] {
  const socket = client.stream as Socket;
  const writes: number[] = [];
  const { _write: write, _writev: writev } = socket as unknown as Record<'_write' | '_writev', (...args: unknown[]) => unknown>;
  Object.assign(socket, {
    _write(...args: unknown[]) {
      writes.push(1);
      return write.apply(socket, args);
    },
    _writev(chunks: unknown[], ...rest: unknown[]) {
      writes.push(chunks.length);
      return writev.apply(socket, [chunks, ...rest]);
    },
  });
  return writes;
}

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
    const writes = countWrites(client);
    expect(await Promise.all(Array.from({ length: 10 }, () => client.ping()))).toEqual(Array(10).fill('PONG'));
    expect(writes).toEqual([10]);
  });

  it("sends a command written while fake timers hold setImmediate, and every later one (a test's fake timers)", async () => {
    // A test that fakes timers while a request is in flight, then goes back to real ones without
    // running them: an uncork left to the fake setImmediate never ran, and the socket stayed
    // corked, every later command of the client waiting (the guard failing open on timeouts).
    const realTimeout = setTimeout;
    jest.useFakeTimers();
    const during = client.ping();
    jest.useRealTimers();
    const within = async <T>(promise: Promise<T>) => {
      let timer: NodeJS.Timeout | undefined;
      try {
        return await Promise.race([promise, new Promise((resolve) => (timer = realTimeout(resolve, 2000, 'still waiting')))]);
      } finally {
        clearTimeout(timer);
      }
    };
    expect(await within(during)).toBe('PONG');
    expect(await within(client.ping())).toBe('PONG');
  });
});
