import type { Socket } from 'node:net';
// Node's own, never a fake timer's (Jest's replace the global one): a socket left corked by an
// uncork a test's fake timers dropped would hold every later command of the client.
import { setImmediate } from 'node:timers';
import type { Cluster, Redis } from 'ioredis';

const COALESCED = Symbol('idempotency.coalescedWrites');

/** A coalescing socket's turn: whether writes wait for its end, and what waits for them to go out. */
interface Turn {
  corked: boolean;
  sent: (() => void)[];
}

type CoalescedSocket = Socket & { [COALESCED]?: Turn };

/**
 * Makes the client's socket send all commands written in one event-loop turn in one `write`
 * (`cork()` on the first write, `uncork()` in `setImmediate`), as node-redis does. ioredis writes
 * each command on its own, which costs a syscall per command on both sides; measured in
 * `npm run bench`, coalescing roughly halves the guard's added CPU per request. Re-applied on
 * every (re)connection. Only for clients the module opens itself.
 */
export function coalesceWrites(client: Redis): void {
  const patch = () => {
    const socket = (client as unknown as { stream?: CoalescedSocket }).stream;
    if (!socket || socket[COALESCED]) return;
    const turn: Turn = (socket[COALESCED] = { corked: false, sent: [] });
    const send = () => {
      turn.corked = false;
      socket.uncork();
      if (turn.sent.length === 0) return;
      const sent = turn.sent;
      turn.sent = [];
      for (const then of sent) then();
    };
    const write = socket.write;
    socket.write = function (this: Socket, ...args: Parameters<Socket['write']>) {
      if (!turn.corked) {
        turn.corked = true;
        socket.cork();
        setImmediate(send);
      }
      return write.apply(this, args);
    } as Socket['write'];
  };
  client.on('connect', patch);
}

/**
 * Runs `then` once the commands the client was given in this turn have left the process: at the
 * turn's end on a client that coalesces its writes, after ioredis's own flush on one with
 * `enableAutoPipelining` (its `setImmediate`, queued at the call, runs first), at once on any
 * other. A command's bound starts there: a stall of the process between the call and the send is
 * not Redis's time.
 */
export function whenWritesSent(client: Redis | Cluster, then: () => void): void {
  if (client.options.enableAutoPipelining) {
    setImmediate(then);
    return;
  }
  const turn = (client as unknown as { stream?: CoalescedSocket }).stream?.[COALESCED];
  if (turn?.corked) turn.sent.push(then);
  else then();
}
