/**
 * The work's answer, or a rejection with `message` once `ms` pass without one (the work may
 * still finish later). The rejection waits one turn of the event loop past the timer: after the
 * process stalled past the bound (a GC pause, a CPU-starved container), Node runs due timers
 * before it reads its sockets, and an answer that arrived in time is read in that turn and wins.
 */
export function withinDeadline<T>(work: Promise<T>, ms: number, message = `no answer within ${ms} ms`): Promise<T> {
  let timer: NodeJS.Timeout | undefined;
  const deadline = new Promise<never>((_, reject) => {
    timer = setTimeout(() => setImmediate(() => reject(new Error(message))), ms);
  });
  return Promise.race([work, deadline]).finally(() => clearTimeout(timer));
}
