import { describe, expect, it } from '@jest/globals';
import { once } from 'node:events';
import { connect, createServer } from 'node:net';
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

  // An answer larger than the socket's receive buffer comes in parts: while parts come in, the
  // bound waits on (by the bound once more at most); a connection that went quiet is given up on.
  it('waits on while an answer comes in on its connection, by the bound once more at most', async () => {
    // Each connection says in its first line when its answer ends (ms), and gets a part every 10 ms until then.
    const server = createServer((peer) => {
      peer.once('data', (line) => {
        const sending = setInterval(() => peer.write('x'.repeat(1000)), 10);
        const ending = setTimeout(() => peer.write('END'), Number(String(line)));
        peer.on('close', () => (clearInterval(sending), clearTimeout(ending)));
        peer.on('error', () => undefined);
      });
    });
    await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
    const { port } = server.address() as { port: number };
    const answer = async (endsAfterMs: number, watched: boolean, boundMs = 200) => {
      const socket = connect(port, '127.0.0.1');
      await once(socket, 'connect');
      socket.write(String(endsAfterMs));
      const work = (async () => {
        for await (const chunk of socket) if (String(chunk).endsWith('END')) return 'answered';
        return 'closed';
      })();
      const connection = { whenSent: (arm: () => void) => arm(), bytesRead: () => socket.bytesRead };
      const started = Date.now();
      try {
        return { result: await withinDeadline(work, boundMs, 'too slow', watched ? connection : undefined), ms: Date.now() - started };
      } catch (error) {
        return { result: (error as Error).message, ms: Date.now() - started };
      } finally {
        socket.destroy();
      }
    };
    try {
      // Past the bound (200 ms) and within it once more: taken while parts come in.
      expect((await answer(300, true)).result).toBe('answered');
      // Past the bound twice: given up on although parts still come, about then.
      const longer = await answer(1000, true);
      expect(longer.result).toBe('too slow');
      expect(longer.ms).toBeLessThan(800);
      // Without the connection to watch, the bound is the bound.
      expect((await answer(300, false)).result).toBe('too slow');
    } finally {
      await new Promise((resolve) => server.close(resolve));
    }
  });
});
