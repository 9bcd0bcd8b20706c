// The capture keeps an answer sent as one string written as UTF-8 (Express's res.send, Fastify's
// JSON) as that text, without encoding it to bytes and decoding them again (issue #15: ~0.7 µs a
// first request). What it saves must stay what the client received, byte for byte, for every way
// a handler can write its answer: a replay sends the same bytes as the first answer.
import { afterAll, beforeAll, describe, expect, it } from '@jest/globals';
import { Controller, HttpCode, Post, Res } from '@nestjs/common';
import { randomUUID } from 'node:crypto';
import type { ServerResponse } from 'node:http';
import { NoRepeatSubmit } from '../libs/idempotency/src/index.js';
import { makeApp, replayed, send, type Adapter, type EdgeApp } from './support/edge-app.js';

type Write = (res: ServerResponse) => void;

/** How each route writes its answer on the Node.js response. */
const WRITES: Record<string, Write> = {
  'one string': (res) => res.end('{"ok":true,"name":"Zoë ✓"}'),
  'one string, utf-8 named': (res) => res.end('plain text ✓', 'utf-8'),
  'a lone surrogate (sent as U+FFFD)': (res) => res.end('half \ud800 a pair'),
  'a NUL in the text': (res) => res.end('a\u0000b'),
  'latin1 text': (res) => res.end('caf\u00e9', 'latin1'),
  'hex text': (res) => res.end('00ff10', 'hex'),
  'two strings': (res) => {
    res.write('first, ');
    res.end('second');
  },
  'a string, then bytes': (res) => {
    res.write('text then ');
    res.end(Buffer.from([0xe2, 0x9c, 0x93]));
  },
  'bytes, then a string': (res) => {
    res.write(Buffer.from('bytes then '));
    res.end('text');
  },
  'an empty string': (res) => res.end(''),
  'an empty string, then text': (res) => {
    res.write('');
    res.end('after empty');
  },
};

@Controller('bytes')
class BytesController {
  @Post('big')
  @NoRepeatSubmit()
  big(@Res() res: ServerResponse) {
    res.statusCode = 201;
    res.end('x'.repeat(2 * 1024 * 1024)); // over the default maxResponseBytes (1 MiB)
  }

  /** Six characters, twelve bytes: over a bound of 10 bytes, though not of 10 characters. */
  @Post('multibyte')
  @NoRepeatSubmit({ maxResponseBytes: 10 })
  multibyte(@Res() res: ServerResponse) {
    res.statusCode = 201;
    res.end('éééééé');
  }

  @Post(':how')
  @HttpCode(201)
  @NoRepeatSubmit()
  answer(@Res() res: ServerResponse & { req: { params: { how: string } } }) {
    const how = decodeURIComponent(res.req.params.how);
    res.statusCode = 201;
    res.setHeader('content-type', 'text/plain; charset=utf-8');
    WRITES[how]!(res);
  }
}

describe.each<Adapter>(['express'])('the bytes a replay sends (%s)', (adapter) => {
  let a: EdgeApp;
  beforeAll(async () => {
    a = await makeApp(adapter, [BytesController]);
  });
  afterAll(async () => a?.close());

  it.each(Object.keys(WRITES))('replays %s byte for byte', async (how) => {
    const key = randomUUID();
    const path = `/bytes/${encodeURIComponent(how)}`;
    const first = await send(a.url, path, { key });
    const again = await send(a.url, path, { key });
    expect({ status: again.status, replayed: replayed(again), bytes: again.body.toString('hex') }).toEqual({
      status: first.status,
      replayed: true,
      bytes: first.body.toString('hex'),
    });
    expect(first.status).toBe(201);
  });

  it('counts the bound in bytes, not characters: six é (12 bytes) over a bound of 10 is not kept', async () => {
    const key = randomUUID();
    const first = await send(a.url, '/bytes/multibyte', { key });
    const again = await send(a.url, '/bytes/multibyte', { key });
    expect({ status: first.status, text: first.text }).toEqual({ status: 201, text: 'éééééé' });
    expect({ status: again.status, code: JSON.parse(again.text).code }).toEqual({ status: 409, code: 'IDEMPOTENCY_RESPONSE_NOT_REPLAYABLE' });
  });

  it('sends an answer over maxResponseBytes in one string whole, and keeps it as not replayable', async () => {
    const key = randomUUID();
    const first = await send(a.url, '/bytes/big', { key });
    const again = await send(a.url, '/bytes/big', { key });
    expect({ status: first.status, length: first.body.length }).toEqual({ status: 201, length: 2 * 1024 * 1024 });
    expect({ status: again.status, code: JSON.parse(again.text).code }).toEqual({ status: 409, code: 'IDEMPOTENCY_RESPONSE_NOT_REPLAYABLE' });
  });
});
