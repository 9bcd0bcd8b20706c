// A replay through the `compression` middleware (`app.use(compression())`, on Express and through
// middie on Fastify) must be a framed HTTP/1.1 message: compression drops the Content-Length while
// it re-encodes, so the body needs chunked framing. The guard removed `Transfer-Encoding` from
// every replay, set or not, and Node marks a response whose Content-Length and Transfer-Encoding
// were both removed as ended by closing the socket: the replay went out with neither, under
// `Connection: keep-alive`, and cost each keep-alive client its connection (an adversarial helper,
// 10 of 10 keys on both adapters).
import { afterAll, beforeAll, describe, expect, it } from '@jest/globals';
import { Controller, HttpCode, Post } from '@nestjs/common';
import compression from 'compression';
import { Agent } from 'node:http';
import { randomUUID } from 'node:crypto';
import { gunzipSync } from 'node:zlib';
import { NoRepeatSubmit } from '../libs/idempotency/src/index.js';
import { makeApp, replayed, send, type Adapter, type EdgeApp, type RawAnswer } from './support/edge-app.js';

let runs = 0;

@Controller('orders')
class OrdersController {
  @Post()
  @NoRepeatSubmit()
  create() {
    runs++;
    // Above compression's 1 KB threshold.
    return { order: runs, lines: 'order line,1,2,3;'.repeat(100) };
  }

  @Post('reset')
  @HttpCode(205)
  @NoRepeatSubmit()
  reset() {
    runs++;
    return '';
  }
}

const framed = (answer: RawAnswer) =>
  answer.headers['content-length'] !== undefined || answer.headers['transfer-encoding'] === 'chunked';
const text = (answer: RawAnswer) =>
  (answer.headers['content-encoding'] === 'gzip' ? gunzipSync(answer.body) : answer.body).toString('utf8');

describe.each<Adapter>(['express', 'fastify'])('replays through the compression middleware on %s', (adapter) => {
  let a: EdgeApp;
  const agent = new Agent({ keepAlive: true, maxSockets: 1 });
  beforeAll(async () => {
    a = await makeApp(adapter, [OrdersController], {}, { setup: (app) => void app.use(compression()) });
  });
  afterAll(async () => {
    agent.destroy();
    await a?.close();
  });

  it.each([
    ['gzip', { 'accept-encoding': 'gzip' }],
    ['no coding', {} as Record<string, string>],
  ])('are framed and keep the connection to a client that takes %s', async (_name, headers) => {
    for (let i = 0; i < 5; i++) {
      const key = randomUUID();
      const before = runs;
      const first = await send(a.url, '/orders', { key, headers: { 'accept-encoding': 'gzip' }, agent });
      expect(first.status).toBe(201);
      const replay = await send(a.url, '/orders', { key, headers, agent });
      expect(replayed(replay)).toBe(true);
      // Observed before: neither header, `connection: keep-alive`, the socket closed to end it.
      expect(framed(replay)).toBe(true);
      expect(replay.headers.connection).not.toBe('close');
      expect(text(replay)).toBe(text(first));
      expect(runs - before).toBe(1);
    }
  });

  // An adversarial helper: Node gives 205 a body, unlike 204 and 304, so a 205 replay without a
  // length (Express had removed its Transfer-Encoding, the replay its Content-Length) ended by
  // closing the keep-alive connection, and a request pipelined behind it was never answered.
  it('replays a 205 with a zero length on a connection that stays open', async () => {
    for (let i = 0; i < 5; i++) {
      const key = randomUUID();
      const before = runs;
      const first = await send(a.url, '/orders/reset', { key, agent });
      const replay = await send(a.url, '/orders/reset', { key, agent });
      expect([first.status, replay.status, replayed(replay), replay.body.length]).toEqual([205, 205, true, 0]);
      expect(replay.headers['content-length']).toBe('0');
      expect(replay.headers.connection).not.toBe('close');
      expect(runs - before).toBe(1);
    }
  });
});
