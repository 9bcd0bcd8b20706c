// A StreamableFile whose stream fails mid-way. Without the guard the client sees the
// connection cut (an incomplete answer). With it, the first client must not get a malformed HTTP
// answer, and a duplicate must never get the truncated bytes replayed as a complete answer.
import { afterAll, beforeAll, describe, expect, it } from '@jest/globals';
import { Controller, Post, StreamableFile } from '@nestjs/common';
import { randomUUID } from 'node:crypto';
import { connect } from 'node:net';
import { Readable } from 'node:stream';
import { NoRepeatSubmit } from '../libs/idempotency/src/index.js';
import { makeApp, replayed, send, sleep, type Adapter, type EdgeApp } from './support/edge-app.js';

/** Three chunks, then the disk goes away. */
function failingFile(): StreamableFile {
  let reads = 0;
  const stream = new Readable({
    read() {
      reads++;
      if (reads <= 3) setTimeout(() => this.push(Buffer.from(`chunk${reads};`)), 5);
      else setTimeout(() => this.destroy(new Error('disk gone')), 5);
    },
  });
  return new StreamableFile(stream, { type: 'application/octet-stream' });
}

let runs = 0;

@Controller('x')
class ExportController {
  @Post('export')
  @NoRepeatSubmit()
  export() {
    runs++;
    return failingFile();
  }

  @Post('ping')
  ping() {
    return { pong: true };
  }

  @Post('unguarded')
  unguarded() {
    return failingFile();
  }
}

describe.each<Adapter>(['express', 'fastify'])('a streamed answer that fails mid-way (%s)', (adapter) => {
  let a: EdgeApp;
  beforeAll(async () => {
    a = await makeApp(adapter, [ExportController]);
  });
  afterAll(async () => a?.close());

  it('(control, no guard) the client sees an incomplete answer, not a malformed one', async () => {
    const first = await send(a.url, '/x/unguarded', { timeoutMs: 2000 });
    expect(first.error).toBe('aborted');
  });

  it('the first client gets a well-formed (or visibly cut) answer; the duplicate is never the truncated bytes', async () => {
    const key = randomUUID();
    const before = runs;
    const first = await send(a.url, '/x/export', { key, timeoutMs: 2000 });
    await sleep(200);
    const second = await send(a.url, '/x/export', { key, timeoutMs: 2000 });
    // "Parse Error: Data after `Connection: close`": the held chunks were flushed ahead of the
    // error handler's own Content-Length'd body.
    expect(first.error ?? '').not.toMatch(/Parse Error/);
    expect({ replayedTruncatedBytes: replayed(second) && second.text.includes('chunk1;') }).toEqual({ replayedTruncatedBytes: false });
    expect(runs - before).toBe(1);
  });

  it('keeps a keep-alive connection in sync: the next answer on the socket is its own', async () => {
    const { port } = new URL(a.url);
    const wire = await new Promise<string>((resolve) => {
      let text = '';
      const socket = connect(Number(port), '127.0.0.1', () => {
        socket.write(`POST /x/export HTTP/1.1\r\nHost: x\r\nIdempotency-Key: ${randomUUID()}\r\nContent-Length: 0\r\n\r\n`);
        setTimeout(() => socket.write('POST /x/ping HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n\r\n'), 300);
      });
      socket.on('data', (chunk) => (text += chunk.toString('latin1')));
      socket.on('error', () => undefined);
      socket.on('close', () => resolve(text));
      setTimeout(() => {
        socket.destroy();
        resolve(text);
      }, 1000);
    });
    // Each answer on the wire must be exactly as long as its Content-Length says: bytes beyond it
    // are read by the client (or a proxy's pooled upstream connection) as the next answer.
    const answers = wire.split(/(?=HTTP\/1\.1 \d{3} )/).filter(Boolean);
    const framing = answers.map((answer) => {
      const [head, ...rest] = answer.split('\r\n\r\n');
      const length = /content-length: (\d+)/i.exec(head)?.[1];
      return { status: head.slice(9, 12), declared: length === undefined ? 'chunked' : Number(length), sent: length === undefined ? 'chunked' : rest.join('\r\n\r\n').length };
    });
    for (const { declared, sent } of framing) expect(sent).toBe(declared);
  });
});
