import { afterEach, describe, expect, it } from '@jest/globals';
import type { AbstractHttpAdapter } from '@nestjs/core';
import { createServer, request, type IncomingHttpHeaders, type ServerResponse } from 'node:http';
import type { AddressInfo } from 'node:net';
import { clearRefusalHeaders, setRefusalHeaders } from './refusal-headers.js';
import { ResponseCapture, type CapturedResponse } from './response-capture.js';

/** The adapter's one call the refusal makes, on a Node.js response (as Express's `res.set` does). */
const adapter = { setHeader: (res: ServerResponse, name: string, value: string) => res.setHeader(name, value) } as unknown as AbstractHttpAdapter;
const REFUSAL = { 'Retry-After': '2', 'Content-Type': 'application/problem+json' };

let close: (() => void) | undefined;
afterEach(() => close?.());

/** One request to a real server whose handler is `answer`: what the client got. */
async function answered(answer: (res: ServerResponse) => void): Promise<{ status: number; headers: IncomingHttpHeaders; body: string }> {
  const server = createServer((_req, res) => answer(res));
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  close = () => server.close();
  const { port } = server.address() as AddressInfo;
  return new Promise((resolve, reject) => {
    request({ host: '127.0.0.1', port, method: 'POST' }, (res) => {
      let body = '';
      res.setEncoding('utf8').on('data', (chunk: string) => (body += chunk));
      res.on('end', () => resolve({ status: res.statusCode!, headers: res.headers, body }));
    })
      .on('error', reject)
      .end();
  });
}

/** What Express's `res.json()` does with a type already set: keeps it, adds the charset. */
function sendJson(res: ServerResponse, status: number, value: unknown): void {
  res.statusCode = status;
  const type = res.getHeader('content-type');
  res.setHeader('content-type', `${type === undefined ? 'application/json' : String(type)}; charset=utf-8`);
  res.end(JSON.stringify(value));
}

describe('a refusal\'s headers (Retry-After, the problem details type)', () => {
  it('go out with the refusal itself', async () => {
    const got = await answered((res) => {
      setRefusalHeaders(res, res, adapter, 409, REFUSAL);
      sendJson(res, 409, { status: 409 });
    });
    expect([got.status, got.headers['content-type'], got.headers['retry-after']]).toEqual([409, 'application/problem+json; charset=utf-8', '2']);
  });

  it('are taken back from an answer with another status: the type becomes JSON, Retry-After goes', async () => {
    const got = await answered((res) => {
      setRefusalHeaders(res, res, adapter, 409, REFUSAL);
      sendJson(res, 201, { pending: true });
    });
    expect([got.status, got.headers['content-type'], got.headers['retry-after']]).toEqual([201, 'application/json; charset=utf-8', undefined]);
  });

  it('are taken back from headers passed to writeHead (as Fastify sends them)', async () => {
    const got = await answered((res) => {
      setRefusalHeaders(res, res, adapter, 409, REFUSAL);
      res.removeHeader('content-type');
      res.removeHeader('retry-after');
      res.writeHead(201, { 'Content-Type': 'application/problem+json; charset=utf-8', 'Retry-After': '2' });
      res.end('{}');
    });
    expect([got.status, got.headers['content-type'], got.headers['retry-after']]).toEqual([201, 'application/json; charset=utf-8', undefined]);
  });

  it('stay where the app set its own since (another type, another Retry-After)', async () => {
    const got = await answered((res) => {
      setRefusalHeaders(res, res, adapter, 409, REFUSAL);
      res.setHeader('Content-Type', 'text/plain');
      res.setHeader('Retry-After', '30');
      res.statusCode = 503;
      res.end('busy');
    });
    expect([got.status, got.headers['content-type'], got.headers['retry-after']]).toEqual([503, 'text/plain', '30']);
  });

  it('stay where the app set them itself since, to the same values, on an answer with another status', async () => {
    const got = await answered((res) => {
      setRefusalHeaders(res, res, adapter, 503, REFUSAL);
      // An exception filter answering the refusal as 429, passing its Retry-After on.
      res.setHeader('Retry-After', String(res.getHeader('retry-after')));
      sendJson(res, 429, { error: 'slow down' });
    });
    // Before: taken back as the refusal's (equal values), the 429 went out without it.
    expect([got.status, got.headers['retry-after']]).toEqual([429, '2']);
  });

  it('stay where the app set them itself, also when the request is run or replayed again', async () => {
    const got = await answered((res) => {
      setRefusalHeaders(res, res, adapter, 409, REFUSAL);
      res.setHeader('Retry-After', '2');
      clearRefusalHeaders(res, res);
      res.statusCode = 201;
      res.end('ran');
    });
    expect(got.headers['retry-after']).toBe('2');
  });

  it('are removed, where unchanged, when the request is run or replayed again', async () => {
    const got = await answered((res) => {
      setRefusalHeaders(res, res, adapter, 409, REFUSAL);
      res.setHeader('Retry-After', '30');
      clearRefusalHeaders(res, res);
      res.statusCode = 201;
      res.end('ran');
    });
    expect([got.headers['content-type'], got.headers['retry-after']]).toEqual([undefined, '30']);
  });

  it('are never saved with an answer of another status, nor sent with it', async () => {
    let saved: CapturedResponse | undefined;
    const got = await answered((res) => {
      setRefusalHeaders(res, res, adapter, 409, REFUSAL);
      const capture = new ResponseCapture(res, ['content-type', 'retry-after'], 1024, 'nest', async (sent) => {
        saved = sent;
      });
      capture.succeed();
      sendJson(res, 201, { paid: 5 });
    });
    expect(saved?.headers).toEqual({ 'content-type': 'application/json; charset=utf-8' });
    expect([got.status, got.headers['content-type'], got.headers['retry-after'], got.body]).toEqual([
      201,
      'application/json; charset=utf-8',
      undefined,
      '{"paid":5}',
    ]);
  });
});
