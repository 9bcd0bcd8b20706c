/** The connection a bounded request went out on, as far as its bound needs it. */
export interface DeadlineConnection {
  /** Calls `arm` once the request has left the process (at once, for a client that writes at the call). */
  whenSent(arm: () => void): void;
  /** Bytes the connection has read so far, when known: answers coming in. */
  bytesRead(): number | undefined;
}

/**
 * The work's answer, or a rejection with `message` once `ms` pass without one (the work may
 * still finish later). The rejection waits one turn of the event loop past the timer: after the
 * process stalled past the bound (a GC pause, a CPU-starved container), Node runs due timers
 * before it reads its sockets, and an answer that arrived in time is read in that turn and wins.
 *
 * With a `connection`, the bound starts when the request was sent, and past it the call waits on
 * as long as each `PROGRESS_MS` brings bytes on the connection. A large answer does not fit in the
 * socket's receive buffer, so after a stall the first read takes a part and the rest comes as the
 * server can send it; and answers come in order on one connection, so bytes coming in are this
 * answer or those before it (a backlog of large replays, which this process is slow to take in):
 * the server is answering, and giving up would turn a healthy store into an outage (a fail-open
 * route would run its handler again). A server that stops answering is given up on within
 * `PROGRESS_MS` of its last byte. What a connection can still have to read is what was asked on
 * it, so the wait ends.
 * One promise and one timer per call (every store command pays it: no `Promise.race`).
 */
export function withinDeadline<T>(work: Promise<T>, ms: number, message = `no answer within ${ms} ms`, connection?: DeadlineConnection): Promise<T> {
  return new Promise<T>((resolve, reject) => {
    let settled = false;
    let timer: NodeJS.Timeout | undefined;
    let read: number | undefined;
    const giveUp = () => {
      if (settled) return;
      const now = connection?.bytesRead();
      if (now !== undefined && now !== read) {
        read = now;
        timer = setTimeout(expire, PROGRESS_MS);
        return;
      }
      reject(new Error(message));
    };
    const expire = () => setImmediate(giveUp);
    if (connection) {
      connection.whenSent(() => {
        if (settled) return;
        read = connection.bytesRead();
        timer = setTimeout(expire, ms);
      });
    } else {
      timer = setTimeout(expire, ms);
    }
    work.then(
      (value) => {
        settled = true;
        clearTimeout(timer);
        resolve(value);
      },
      (error: unknown) => {
        settled = true;
        clearTimeout(timer);
        reject(error);
      },
    );
  });
}

/** How long a bound past its time waits for more of an answer that is coming in. */
const PROGRESS_MS = 50;
