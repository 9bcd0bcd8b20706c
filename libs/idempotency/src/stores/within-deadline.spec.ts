import { describe, expect, it } from '@jest/globals';
import { once } from 'node:events';
import { connect } from 'node:net';
import { REDIS_URL } from '../../../../test/support/services.js';
import { withinDeadline } from './within-deadline.js';

describe('withinDeadline', () => {
  it('answers with the work, or rejects with the message once the bound passes', async () => {
    await expect(withinDeadline(Promise.resolve('ok'), 50)).resolves.toBe('ok');
    const started = Date.now();
    await expect(withinDeadline(new Promise(() => undefined), 50, 'too slow')).rejects.toThrow('too slow');
    expect(Date.now() - started).toBeGreaterThanOrEqual(45);
  });

  // Node runs due timers before it reads its sockets: after a stall past the bound, an answer
  // that arrived in time must win over the bound (Redis, another process, answers a PING).
  it('takes an answer that arrived while the process stalled past the bound', async () => {
    const { hostname, port } = new URL(REDIS_URL);
    const socket = connect(Number(port || 6379), hostname);
    await once(socket, 'connect');
    try {
      const answer = withinDeadline(once(socket, 'data').then(([chunk]) => String(chunk)), 100);
      socket.write('PING\r\n');
      const stallUntil = Date.now() + 300;
      while (Date.now() < stallUntil); // the stall: no timer and no socket is served meanwhile
      await expect(answer).resolves.toBe('+PONG\r\n');
    } finally {
      socket.destroy();
    }
  });
});
