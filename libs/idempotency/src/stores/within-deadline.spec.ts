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

  // An answer larger than the socket's receive buffer comes in parts, and answers come in order
  // on one connection (a backlog of large replays): while parts come in, the bound waits on; a
  // connection that went quiet is given up on.
  it('waits on while an answer comes in on its connection, and gives up once it goes quiet', async () => {
    // Each connection says in its first line when its parts stop and when its answer ends (ms);
    // it gets a part every 10 ms until they stop.
    const server = createServer((peer) => {
      peer.once('data', (line) => {
        const [stopsAfterMs, endsAfterMs] = String(line).split(',').map(Number);
        const sending = setInterval(() => peer.write('x'.repeat(1000)), 10);
        const stopping = setTimeout(() => clearInterval(sending), stopsAfterMs);
        const ending = setTimeout(() => peer.write('END'), endsAfterMs);
        peer.on('close', () => (clearInterval(sending), clearTimeout(stopping), clearTimeout(ending)));
        peer.on('error', () => undefined);
      });
    });
    await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
    const { port } = server.address() as { port: number };
    const answer = async (stopsAfterMs: number, endsAfterMs: number, watched: boolean, boundMs = 200) => {
      const socket = connect(port, '127.0.0.1');
      await once(socket, 'connect');
      socket.write(`${stopsAfterMs},${endsAfterMs}`);
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
      // Parts all along, the answer at three times the bound (200 ms): taken.
      expect((await answer(600, 600, true)).result).toBe('answered');
      // Parts for 400 ms, then nothing (the answer would come at 2 s): given up on soon after they stop.
      const quiet = await answer(400, 2000, true);
      expect(quiet.result).toBe('too slow');
      expect(quiet.ms).toBeLessThan(1200);
      // Without the connection to watch, the bound is the bound (the answer would come at 800 ms).
      expect((await answer(600, 800, false)).result).toBe('too slow');
    } finally {
      await new Promise((resolve) => server.close(resolve));
    }
  });
});
