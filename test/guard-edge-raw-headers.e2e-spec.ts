// A handler that answers itself (`@Res()`) and gives `writeHead` its headers in Node's array form
// (`['Content-Type', 'application/json', 'Location', '/x']`): Node writes them without keeping
// them on the response, so the capture must read them from the call, or the replay loses them.
import { afterAll, beforeAll, describe, expect, it } from '@jest/globals';
import { Controller, Post, Res } from '@nestjs/common';
import { randomUUID } from 'node:crypto';
import type { ServerResponse } from 'node:http';
import { NoRepeatSubmit } from '../libs/idempotency/src/index.js';
import { makeApp, replayed, send, type Adapter, type EdgeApp } from './support/edge-app.js';

let runs = 0;

function controllerFor(adapter: Adapter) {
  @Controller('raw')
  class RawController {
    @Post('flat')
    @NoRepeatSubmit()
    flat(@Res() res: unknown) {
      const raw = rawOf(adapter, res);
      runs++;
      raw.writeHead(201, ['Content-Type', 'application/json', 'Location', `/raw/${runs}`]);
      raw.end(JSON.stringify({ id: runs }));
    }

    @Post('pairs')
    @NoRepeatSubmit()
    pairs(@Res() res: unknown) {
      const raw = rawOf(adapter, res);
      runs++;
      raw.writeHead(201, [
        ['Content-Type', 'application/json'],
        ['Location', `/raw/${runs}`],
      ] as unknown as string[]);
      raw.end(JSON.stringify({ id: runs }));
    }
  }
  return RawController;
}

/** The Node.js response: Express's own, or Fastify's `reply.raw` once the reply is hijacked. */
function rawOf(adapter: Adapter, res: unknown): ServerResponse {
  if (adapter === 'express') return res as ServerResponse;
  const reply = res as { hijack(): void; raw: ServerResponse };
  reply.hijack();
  return reply.raw;
}

describe.each<Adapter>(['express', 'fastify'])('headers given to writeHead as an array (%s)', (adapter) => {
  let a: EdgeApp;
  beforeAll(async () => {
    a = await makeApp(adapter, [controllerFor(adapter)], {}, {
      // Express's X-Powered-By would make Node keep a header map (helmet removes it too).
      setup: (app) => {
        if (adapter === 'express') (app.getHttpAdapter().getInstance() as { disable(name: string): void }).disable('x-powered-by');
      },
    });
  });
  afterAll(async () => a?.close());

  it.each(['flat', 'pairs'])('replays the %s array\'s Content-Type and Location', async (form) => {
    const key = randomUUID();
    const first = await send(a.url, `/raw/${form}`, { key });
    const replay = await send(a.url, `/raw/${form}`, { key });
    expect(first.headers['location']).toMatch(/^\/raw\/\d+$/);
    expect({ replayed: replayed(replay), type: replay.headers['content-type'], location: replay.headers['location'], body: replay.text }).toEqual({
      replayed: true,
      type: 'application/json',
      location: first.headers['location'],
      body: first.text,
    });
  });
});
