// A streamed answer (server-sent events from a POST, NDJSON, an LLM-style completion) on a guarded
// route. The guard holds an answer's bytes until it ends and is saved (up to maxResponseBytes),
// so that an immediate retry is replayed, never refused: a stream arrives whole at its end. An
// adversarial helper (session 19) found that undocumented. `maxResponseBytes: 0` lets it flow as
// written: the handler still runs once, and a duplicate gets 409 IDEMPOTENCY_RESPONSE_NOT_REPLAYABLE.
import { afterAll, beforeAll, describe, expect, it } from '@jest/globals';
import { Controller, Injectable, Post, Res } from '@nestjs/common';
import { randomUUID } from 'node:crypto';
import type { ServerResponse } from 'node:http';
import { request } from 'node:http';
import { MemoryIdempotencyStore, NoRepeatSubmit } from '../libs/idempotency/src/index.js';
import { codeOf, makeApp, send, until, type Adapter, type EdgeApp } from './support/edge-app.js';

/** Lets each stream's second event go when the test says. */
@Injectable()
class Gate {
  runs = 0;
  private open: (() => void) | undefined;
  release(): void {
    this.open?.();
  }
  async run(res: ServerResponse, tag: string): Promise<void> {
    this.runs++;
    const opened = new Promise<void>((resolve) => (this.open = resolve));
    res.writeHead(200, { 'content-type': 'text/event-stream' });
    res.write(`data: ${tag} 1\n\n`);
    await opened;
    res.end(`data: ${tag} 2\n\n`);
  }
}

@Controller()
class StreamController {
  constructor(private readonly gate: Gate) {}

  @Post('streamed')
  @NoRepeatSubmit({ maxResponseBytes: 0 })
  streamed(@Res() res: ServerResponse | { raw: ServerResponse }) {
    return this.gate.run('raw' in res ? res.raw : res, 'streamed');
  }

  @Post('held')
  @NoRepeatSubmit()
  held(@Res() res: ServerResponse | { raw: ServerResponse }) {
    return this.gate.run('raw' in res ? res.raw : res, 'held');
  }
}

/** POSTs with `key`, and says what had come in at each moment. */
function stream(url: string, path: string, key: string) {
  const received: string[] = [];
  const ended = new Promise<string>((resolve, reject) => {
    const req = request(`${url}${path}`, { method: 'POST', headers: { 'idempotency-key': key }, agent: false }, (res) => {
      res.setEncoding('utf8');
      res.on('data', (chunk: string) => received.push(chunk));
      res.on('end', () => resolve(received.join('')));
    });
    req.on('error', reject);
    req.end();
  });
  return { received, ended };
}

describe.each<Adapter>(['express', 'fastify'])('a streamed answer on a guarded route (%s)', (adapter) => {
  let edge: EdgeApp;
  beforeAll(async () => {
    edge = await makeApp(adapter, [StreamController], { store: new MemoryIdempotencyStore() }, { providers: [Gate] });
  });
  afterAll(async () => edge?.close());

  it('flows as written with maxResponseBytes: 0, runs once, and a duplicate is refused as not replayable', async () => {
    const gate = edge.app.get(Gate);
    gate.runs = 0;
    const key = randomUUID();
    const { received, ended } = stream(edge.url, '/streamed', key);
    // The first event arrives while the handler still waits to send the second.
    await until(() => received.join('').includes('data: streamed 1'), 5000, 'the first event before the stream ends');
    gate.release();
    expect(await ended).toBe('data: streamed 1\n\ndata: streamed 2\n\n');
    const duplicate = await send(edge.url, '/streamed', { key });
    expect({ status: duplicate.status, code: codeOf(duplicate), runs: gate.runs }).toEqual({
      status: 409,
      code: 'IDEMPOTENCY_RESPONSE_NOT_REPLAYABLE',
      runs: 1,
    });
  });

  it('arrives whole at its end under the default bound, and is replayed', async () => {
    const gate = edge.app.get(Gate);
    gate.runs = 0;
    const key = randomUUID();
    const { received, ended } = stream(edge.url, '/held', key);
    await until(() => gate.runs === 1);
    await new Promise((resolve) => setTimeout(resolve, 200));
    expect(received).toEqual([]);
    gate.release();
    expect(await ended).toBe('data: held 1\n\ndata: held 2\n\n');
    const duplicate = await send(edge.url, '/held', { key });
    expect({ text: duplicate.text, replayed: duplicate.headers['idempotent-replayed'], runs: gate.runs }).toEqual({
      text: 'data: held 1\n\ndata: held 2\n\n',
      replayed: 'true',
      runs: 1,
    });
  });
});
