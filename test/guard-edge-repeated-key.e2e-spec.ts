// The Idempotency-Key header sent twice (`Idempotency-Key: a` and `Idempotency-Key: b`): Node
// joins the two lines into `a, b`, which the guard took for one key. The draft's key is one
// string; two of them name no single operation, so the call is refused 400, never keyed `a, b`.
import { afterAll, beforeAll, describe, expect, it } from '@jest/globals';
import { Controller, Post } from '@nestjs/common';
import { connect } from 'node:net';
import { NoRepeatSubmit } from '../libs/idempotency/src/index.js';
import { makeApp, type Adapter, type EdgeApp } from './support/edge-app.js';

let runs = 0;

@Controller('orders')
class OrdersController {
  @Post()
  @NoRepeatSubmit()
  create() {
    runs++;
    return { run: runs };
  }

  @Post('by-request-key')
  @NoRepeatSubmit({ idempotentKey: "#headers['x-request-key']" })
  byRequestKey() {
    runs++;
    return { run: runs };
  }
}

/** Sends the request with each key on a header line of its own; the status line and body. */
function postWithKeyLines(url: string, keys: string[], header = 'Idempotency-Key', path = '/orders'): Promise<{ status: number; body: string }> {
  const { port } = new URL(url);
  const lines = keys.map((key) => `${header}: ${key}\r\n`).join('');
  return new Promise((resolve, reject) => {
    let text = '';
    const socket = connect(Number(port), '127.0.0.1', () =>
      socket.write(`POST ${path} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n${lines}Content-Length: 0\r\n\r\n`),
    );
    socket.on('data', (chunk) => (text += chunk.toString('utf8')));
    socket.on('end', () => resolve({ status: Number(text.split(' ')[1]), body: text.slice(text.indexOf('\r\n\r\n') + 4) }));
    socket.on('error', reject);
  });
}

describe.each<Adapter>(['express', 'fastify'])('the key header sent twice (%s)', (adapter) => {
  let a: EdgeApp;
  beforeAll(async () => {
    a = await makeApp(adapter, [OrdersController]);
  });
  afterAll(async () => a?.close());

  it('is refused 400 IDEMPOTENCY_KEY_INVALID, and the handler does not run', async () => {
    const before = runs;
    const answer = await postWithKeyLines(a.url, ['a', 'b']);
    expect({ status: answer.status, runs: runs - before }).toEqual({ status: 400, runs: 0 });
    expect(answer.body).toContain('IDEMPOTENCY_KEY_INVALID');
  });

  it('is refused 400 too when a key expression reads the header (#headers[...])', async () => {
    const before = runs;
    const answer = await postWithKeyLines(a.url, ['a', 'b'], 'X-Request-Key', '/orders/by-request-key');
    expect({ status: answer.status, runs: runs - before }).toEqual({ status: 400, runs: 0 });
  });

  it('(control) one line holding a comma is one key', async () => {
    const before = runs;
    const answer = await postWithKeyLines(a.url, [`order, ${Math.random()}`]);
    expect({ status: answer.status, runs: runs - before }).toEqual({ status: 201, runs: 1 });
  });
});
