/** What a run carries to be on a `RunList`: its links, which only the list touches. */
export interface ListedRun<T> {
  previousRun?: T;
  nextRun?: T;
  listed?: boolean;
}

/**
 * The runs in flight, in the order they began: a doubly linked list through the runs themselves,
 * so that adding and removing one allocates nothing. A `Set` of them emptied and shrank its table
 * on the last run's delete, a call into V8's runtime on every request of an app with one call in
 * flight at a time (0.7-1 µs a first request in the in-process bench: bench/README.md).
 */
export class RunList<T extends ListedRun<T>> implements Iterable<T> {
  size = 0;
  private first?: T;
  private last?: T;

  add(run: T): void {
    if (run.listed) return;
    run.listed = true;
    run.previousRun = this.last;
    run.nextRun = undefined;
    if (this.last) this.last.nextRun = run;
    else this.first = run;
    this.last = run;
    this.size++;
  }

  /** Takes `run` off the list; false when it was not on it. */
  delete(run: T): boolean {
    if (!run.listed) return false;
    run.listed = false;
    const { previousRun, nextRun } = run;
    if (previousRun) previousRun.nextRun = nextRun;
    else this.first = nextRun;
    if (nextRun) nextRun.previousRun = previousRun;
    else this.last = previousRun;
    run.previousRun = run.nextRun = undefined;
    this.size--;
    return true;
  }

  *[Symbol.iterator](): Iterator<T> {
    for (let run = this.first; run; run = run.nextRun) yield run;
  }
}
