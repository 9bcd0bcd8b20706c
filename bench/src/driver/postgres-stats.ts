import { readdir, readFile } from 'node:fs/promises';

/** Linux's clock ticks per second in /proc (`USER_HZ`, `getconf CLK_TCK`): 100 on every architecture it runs. */
const TICKS_PER_SECOND = 100;

/**
 * CPU time every PostgreSQL process on this machine used so far (user + system: the backends, the
 * WAL writer, the checkpointer), microseconds, read from /proc; undefined where there is no /proc.
 * A backend that exits between two readings takes its time with it, so a difference between two
 * readings is a lower bound (the bench's pool keeps its connections).
 */
export async function postgresCpuMicros(): Promise<number | undefined> {
  let pids: string[];
  try {
    pids = (await readdir('/proc')).filter((name) => /^\d+$/.test(name));
  } catch {
    return undefined;
  }
  let ticks = 0;
  for (const pid of pids) {
    const stat = await readFile(`/proc/${pid}/stat`, 'utf8').catch(() => '');
    const open = stat.indexOf('(');
    const close = stat.lastIndexOf(')');
    if (open < 0 || close < 0 || stat.slice(open + 1, close) !== 'postgres') continue;
    // After the name: state is field 3, utime field 14, stime field 15 (proc(5)).
    const fields = stat.slice(close + 2).split(' ');
    ticks += Number(fields[11]) + Number(fields[12]);
  }
  return (ticks * 1e6) / TICKS_PER_SECOND;
}
