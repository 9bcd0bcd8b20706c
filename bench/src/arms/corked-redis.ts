import { Redis } from 'ioredis';
import type { Socket } from 'node:net';
import { REDIS_CLIENT_DEFAULTS } from '../../../libs/idempotency/src/index.js';

const CORKED = Symbol('bench.corked');

/**
 * Lever: an ioredis client whose socket writes are coalesced per event-loop turn, as node-redis
 * does (`cork()` on the first write, `uncork()` in `setImmediate`): every command issued by the
 * requests handled in one turn leaves in one `write` syscall, and Redis reads them in one go.
 * Same client options as the module's own (`REDIS_CLIENT_DEFAULTS`).
 */
export function corkedRedis(url: string): Redis {
  const client = new Redis(url, REDIS_CLIENT_DEFAULTS);
  client.on('error', () => undefined);
  const patch = () => {
    const socket = (client as unknown as { stream?: Socket & { [CORKED]?: true } }).stream;
    if (!socket || socket[CORKED]) return;
    socket[CORKED] = true;
    const write = socket.write;
    let corked = false;
    socket.write = function (this: Socket, ...args: Parameters<Socket['write']>) {
      if (!corked) {
        corked = true;
        socket.cork();
        setImmediate(() => {
          corked = false;
          socket.uncork();
        });
      }
      return write.apply(this, args);
    } as Socket['write'];
  };
  client.on('connect', patch);
  return client;
}
