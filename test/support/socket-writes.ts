import type { Socket } from 'node:net';

/**
 * Counts the writes reaching `socket` from now on: one entry per `_write` (1) or `_writev` (the
 * chunks it holds), so that a test sees whether commands written in one turn went out together.
 */
export function countSocketWrites(socket: Socket): number[] {
  const writes: number[] = [];
  const { _write: write, _writev: writev } = socket as unknown as Record<'_write' | '_writev', (...args: unknown[]) => unknown>;
  Object.assign(socket, {
    _write(...args: unknown[]) {
      writes.push(1);
      return write.apply(socket, args);
    },
    _writev(chunks: unknown[], ...rest: unknown[]) {
      writes.push(chunks.length);
      return writev.apply(socket, [chunks, ...rest]);
    },
  });
  return writes;
}
