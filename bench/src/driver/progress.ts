/**
 * A progress bar on stderr: redrawn in place on a terminal, one line per step otherwise (CI logs).
 * Steps carry a weight (their expected seconds), so the time left is estimated from the work done.
 */
export class Progress {
  private steps = 0;
  private done = 0;
  private total = 0;
  private doneWeight = 0;
  private readonly weights: number[] = [];
  private readonly startedAt = Date.now();
  private readonly tty = process.stderr.isTTY === true;

  /** Plans `count` more steps of about `seconds` each. */
  plan(count: number, seconds: number): void {
    for (let i = 0; i < count; i++) this.weights.push(seconds);
    this.steps += count;
    this.total += count * seconds;
  }

  step(label: string): void {
    if (this.done < this.steps) this.doneWeight += this.weights[this.done++];
    this.draw(label);
  }

  /** Shows what runs now without counting a step. */
  show(label: string): void {
    this.draw(label);
  }

  /** Prints a line above the bar. */
  log(line: string): void {
    if (this.tty) process.stderr.write('\r\x1b[2K');
    process.stderr.write(`${line}\n`);
  }

  finish(): void {
    if (this.tty) process.stderr.write('\n');
  }

  private draw(label: string): void {
    const width = 28;
    const ratio = this.total === 0 ? 1 : Math.min(1, this.doneWeight / this.total);
    const filled = Math.round(ratio * width);
    const elapsed = (Date.now() - this.startedAt) / 1000;
    const eta = this.doneWeight > 0 ? (elapsed / this.doneWeight) * (this.total - this.doneWeight) : Number.NaN;
    const bar = `[${'#'.repeat(filled)}${'-'.repeat(width - filled)}] ${String(Math.round(ratio * 100)).padStart(3)}% ${this.done}/${this.steps}`;
    const time = `${fmtSeconds(elapsed)}${Number.isFinite(eta) ? `, ~${fmtSeconds(eta)} left` : ''}`;
    const line = `${bar} ${time}  ${label}`;
    if (this.tty) process.stderr.write(`\r\x1b[2K${line.slice(0, (process.stderr.columns ?? 120) - 1)}`);
    else if (!label.startsWith('…')) process.stderr.write(`${line}\n`);
  }
}

function fmtSeconds(seconds: number): string {
  const s = Math.round(seconds);
  return s >= 60 ? `${Math.floor(s / 60)}m${String(s % 60).padStart(2, '0')}s` : `${s}s`;
}
