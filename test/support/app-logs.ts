// Jest setup file: the Nest apps under test log to `.test-logs/apps.log`, not to the test
// runner's output, so that a passing `npm test` prints only the runner's lines. A test that
// asserts on a log line spies on `Logger` as before; this only moves where ConsoleLogger writes.
import { ConsoleLogger } from '@nestjs/common';
import { appendFileSync, mkdirSync } from 'node:fs';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';

export const APP_LOG = join(fileURLToPath(new URL('../..', import.meta.url)), '.test-logs', 'apps.log');

const ANSI = /\x1b\[[0-9;]*m/g;
type Print = (this: ConsoleLogger, ...args: unknown[]) => void;
const prototype = ConsoleLogger.prototype as unknown as Record<string, Print>;

mkdirSync(join(APP_LOG, '..'), { recursive: true });
for (const method of ['printMessages', 'printStackTrace', 'printAsJson']) {
  const print = prototype[method];
  if (typeof print !== 'function') continue;
  prototype[method] = function (this: ConsoleLogger, ...args: unknown[]) {
    const { stdout, stderr } = process;
    const [out, err] = [stdout.write, stderr.write];
    const toFile = ((chunk: string | Uint8Array) => {
      appendFileSync(APP_LOG, String(chunk).replace(ANSI, ''));
      return true;
    }) as typeof stdout.write;
    stdout.write = toFile;
    stderr.write = toFile;
    try {
      print.apply(this, args);
    } finally {
      stdout.write = out;
      stderr.write = err;
    }
  };
}
