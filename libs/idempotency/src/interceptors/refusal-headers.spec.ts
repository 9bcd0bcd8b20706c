import { afterEach, describe, expect, it } from '@jest/globals';
import type { AbstractHttpAdapter } from '@nestjs/core';
import { createServer, request, type IncomingHttpHeaders, type ServerResponse } from 'node:http';
import type { AddressInfo } from 'node:net';
import { clearRefusalHeaders, setRefusalHeaders } from './refusal-headers.js';
import { ResponseCapture, type CapturedResponse } from './response-capture.js';

/** The adapter's one call the refusal makes: Express's `res.set` (Node's setHeader), Fastify's `reply.header`. */
const adapter = {
  setHeader: (res: ServerResponse | Reply, name: string, value: string) => ('raw' in res ? res.header(name, value) : res.setHeader(name, value)),
} as unknown as AbstractHttpAdapter;

/** What Fastify's reply does with headers: keeps them apart from the Node response, and passes them to `writeHead`. */
class Reply {
  private readonly list: Record<string, unknown> = {};
  constructor(readonly raw: ServerResponse) {}
  header(name: string, value: unknown): this {
    this.list[name.toLowerCase()] = value;
    return this;
  }
  getHeader(name: string): unknown {
    return this.list[name.toLowerCase()] ?? this.raw.getHeader(name);
  }
  /** Fastify's removes the Node response's too. */
  removeHeader(name: string): this {
    delete this.list[name.toLowerCase()];
    if (!this.raw.headersSent) this.raw.removeHeader(name);
    return this;
  }
  send(status: number, body: string): void {
    this.raw.writeHead(status, this.list as Record<string, string>);
    this.raw.end(body);
  }
  /** A stream's answer: Fastify copies its headers onto the Node response, then lets Node write the head. */
  sendStream(status: number, body: string): void {
    for (const name in this.list) this.raw.setHeader(name, this.list[name] as string);
    this.raw.statusCode = status;
    this.raw.end(body);
  }
}
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
    const got = await answered((raw) => {
      const reply = new Reply(raw);
      setRefusalHeaders(reply as never, raw, adapter, 409, REFUSAL);
      reply.header('Content-Type', 'application/problem+json; charset=utf-8');
      reply.send(201, '{}');
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

  // helper-225: recorded before the call, a failed set kept the refusal's value on the answer.
  it('are taken back where the app tried to set its own and the call threw', async () => {
    const got = await answered((res) => {
      setRefusalHeaders(res, res, adapter, 503, REFUSAL);
      expect(() => res.setHeader('Retry-After', undefined as unknown as string)).toThrow();
      sendJson(res, 429, { error: 'slow down' });
    });
    expect([got.status, got.headers['retry-after']]).toEqual([429, undefined]);
  });

  // helper-225: a Retry-After set before the refusal (a middleware's) was lost with the refusal's.
  it("give back the app's own value they replaced, on an answer with another status", async () => {
    const got = await answered((res) => {
      res.setHeader('Retry-After', '99');
      setRefusalHeaders(res, res, adapter, 409, REFUSAL);
      sendJson(res, 201, { ran: true });
    });
    expect([got.status, got.headers['retry-after']]).toEqual([201, '99']);
  });

  describe("on Fastify's reply, which passes its own headers to writeHead", () => {
    it('are taken back from an answer with another status', async () => {
      const got = await answered((raw) => {
        const reply = new Reply(raw);
        setRefusalHeaders(reply as never, raw, adapter, 409, REFUSAL);
        reply.send(429, '{}');
      });
      expect([got.status, got.headers['retry-after']]).toEqual([429, undefined]);
    });

    it('stay where the app set them on the reply itself since, to the same value', async () => {
      const got = await answered((raw) => {
        const reply = new Reply(raw);
        setRefusalHeaders(reply as never, raw, adapter, 409, REFUSAL);
        reply.header('Retry-After', '2');
        reply.send(429, '{}');
      });
      expect([got.status, got.headers['retry-after']]).toEqual([429, '2']);
    });

    // helper-225: told of the Node response's set, the guard left its own value in the reply's
    // headers, which writeHead sends over the app's: Retry-After: 2 where the app set 30.
    // helper-227: taking its own back from the reply, the guard removed the Node response's too.
    it("leave the Node response's own when the request runs again: set before the refusal, or since", async () => {
      for (const before of [true, false]) {
        const got = await answered((raw) => {
          const reply = new Reply(raw);
          if (before) raw.setHeader('Retry-After', '99');
          setRefusalHeaders(reply as never, raw, adapter, 409, REFUSAL);
          if (!before) raw.setHeader('Retry-After', '99');
          clearRefusalHeaders(reply as never, raw);
          reply.send(201, '{}');
        });
        expect([before, got.status, got.headers['retry-after']]).toEqual([before, 201, '99']);
      }
    });

    it('give way to a value the app set on the Node response since, on the refusal\'s own status too', async () => {
      const got = await answered((raw) => {
        const reply = new Reply(raw);
        setRefusalHeaders(reply as never, raw, adapter, 409, REFUSAL);
        raw.setHeader('Retry-After', '30');
        reply.send(409, '{}');
      });
      expect([got.status, got.headers['retry-after']]).toEqual([409, '30']);
    });

    // helper-228: each header Fastify copied for a stream was taken for the app's: the refusal's reached a 202.
    it('are taken back from a streamed answer with another status, giving back what the Node response had', async () => {
      const cases: [string, (raw: ServerResponse) => void, (raw: ServerResponse) => void, string | undefined][] = [
        ['none', () => undefined, () => undefined, undefined],
        ['before', (raw) => raw.setHeader('Retry-After', '99'), () => undefined, '99'],
        ['since', () => undefined, (raw) => raw.setHeader('Retry-After', '30'), '30'],
      ];
      for (const [name, before, since, expected] of cases) {
        const got = await answered((raw) => {
          const reply = new Reply(raw);
          before(raw);
          setRefusalHeaders(reply as never, raw, adapter, 409, REFUSAL);
          since(raw);
          reply.header('Content-Type', 'text/plain');
          reply.sendStream(202, 'pending');
        });
        expect([name, got.status, got.headers['retry-after'], got.headers['content-type']]).toEqual([name, 202, expected, 'text/plain']);
      }
    });

    // helper-229: a set on the Node response equal to the reply's own was taken for Fastify's copy
    // (a JSON 429 lost the app's 2); a removal there was not seen (a stream got the middleware's 99 back).
    it("keep the app's value on the Node response equal to the refusal's, and its removal there", async () => {
      const cases: [string, (raw: ServerResponse) => void, (raw: ServerResponse) => void, (reply: Reply) => void, string | undefined][] = [
        ['equal, JSON', () => undefined, (raw) => raw.setHeader('Retry-After', '2'), (reply) => reply.send(429, '{}'), '2'],
        ['equal, stream', () => undefined, (raw) => raw.setHeader('Retry-After', '2'), (reply) => reply.sendStream(202, 'pending'), '2'],
        ['removed, stream', (raw) => raw.setHeader('Retry-After', '99'), (raw) => raw.removeHeader('Retry-After'), (reply) => reply.sendStream(202, 'pending'), undefined],
      ];
      for (const [name, before, since, answer, expected] of cases) {
        const got = await answered((raw) => {
          const reply = new Reply(raw);
          before(raw);
          setRefusalHeaders(reply as never, raw, adapter, 409, REFUSAL);
          since(raw);
          answer(reply);
        });
        expect([name, got.headers['retry-after']]).toEqual([name, expected]);
      }
    });

    it('give way on a streamed refusal to a value the app set on the Node response since', async () => {
      const got = await answered((raw) => {
        const reply = new Reply(raw);
        setRefusalHeaders(reply as never, raw, adapter, 409, REFUSAL);
        raw.setHeader('Retry-After', '30');
        reply.sendStream(409, '{}');
      });
      expect([got.status, got.headers['retry-after']]).toEqual([409, '30']);
    });

    it('give way to a value the app set on the Node response since', async () => {
      const got = await answered((raw) => {
        const reply = new Reply(raw);
        setRefusalHeaders(reply as never, raw, adapter, 409, REFUSAL);
        raw.setHeader('Retry-After', '30');
        reply.send(429, '{}');
      });
      expect([got.status, got.headers['retry-after']]).toEqual([429, '30']);
    });
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
