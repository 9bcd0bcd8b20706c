import { describe, expect, it } from '@jest/globals';
import { RunList, type ListedRun } from './run-list.js';

class Run implements ListedRun<Run> {
  previousRun?: Run;
  nextRun?: Run;
  listed?: boolean;
  constructor(readonly name: string) {}
}

const names = (list: RunList<Run>) => [...list].map((run) => run.name);

describe('RunList', () => {
  it('keeps the runs in the order they began, through deletes at either end and in the middle', () => {
    const list = new RunList<Run>();
    const [a, b, c, d] = ['a', 'b', 'c', 'd'].map((name) => new Run(name));
    for (const run of [a, b, c, d]) list.add(run);
    expect(names(list)).toEqual(['a', 'b', 'c', 'd']);
    expect(list.delete(b)).toBe(true);
    expect(names(list)).toEqual(['a', 'c', 'd']);
    expect(list.delete(a)).toBe(true);
    expect(list.delete(d)).toBe(true);
    expect(names(list)).toEqual(['c']);
    expect(list.size).toBe(1);
    expect(list.delete(c)).toBe(true);
    expect(names(list)).toEqual([]);
    expect(list.size).toBe(0);
    // Emptied, it takes runs again, a deleted one included.
    list.add(b);
    list.add(a);
    expect(names(list)).toEqual(['b', 'a']);
  });

  it('says a run not on it was not deleted, and counts a run added twice once', () => {
    const list = new RunList<Run>();
    const a = new Run('a');
    expect(list.delete(a)).toBe(false);
    list.add(a);
    list.add(a);
    expect(list.size).toBe(1);
    expect(list.delete(a)).toBe(true);
    expect(list.delete(a)).toBe(false);
    expect(list.size).toBe(0);
  });
});
