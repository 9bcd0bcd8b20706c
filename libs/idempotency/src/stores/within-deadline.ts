/**
 * The work's answer, or a rejection with `message` once `ms` pass without one (the work may
 * still finish later). The rejection waits one turn of the event loop past the timer: after the
 * process stalled past the bound (a GC pause, a CPU-starved container), Node runs due timers
 * before it reads its sockets, and an answer that arrived in time is read in that turn and wins.
 * `start`, when given, says when the bound starts (it calls `arm`): when the work's request left
 * the process, for a client that sends its writes at the turn's end.
 * One promise and one timer per call (every store command pays it: no `Promise.race`).
 */
export function withinDeadline<T>(
  work: Promise<T>,
  ms: number,
  message = `no answer within ${ms} ms`,
  start?: (arm: () => void) => void,
): Promise<T> {
  return new Promise<T>((resolve, reject) => {
    let settled = false;
    let timer: NodeJS.Timeout | undefined;
    const arm = () => {
      if (!settled) timer = setTimeout(() => setImmediate(() => settled || reject(new Error(message))), ms);
    };
    if (start) start(arm);
    else arm();
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
