/**
 * The work's answer, or a rejection with `message` once `ms` pass without one (the work may
 * still finish later). The rejection waits one turn of the event loop past the timer: after the
 * process stalled past the bound (a GC pause, a CPU-starved container), Node runs due timers
 * before it reads its sockets, and an answer that arrived in time is read in that turn and wins.
 * One promise and one timer per call (every store command pays it: no `Promise.race`).
 */
export function withinDeadline<T>(work: Promise<T>, ms: number, message = `no answer within ${ms} ms`): Promise<T> {
  return new Promise<T>((resolve, reject) => {
    let settled = false;
    const timer = setTimeout(() => setImmediate(() => settled || reject(new Error(message))), ms);
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
