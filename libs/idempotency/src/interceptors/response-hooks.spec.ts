// Where the guard's hooks go on a Node.js response, over a real HTTP server: a response built by
// its class (Fastify's reply.raw) takes them as its own properties; one whose prototype was swapped
// after it was built (Express sets its app's `response` on every response; done here the way
// Express does it) takes a single property and a derived prototype, because every property added
// to such an object gives it a hidden class of its own (bench/README.md has the cost).
import { afterEach, describe, expect, it } from '@jest/globals';
import { createServer, ServerResponse, type IncomingMessage, type Server } from 'node:http';
import type { AddressInfo } from 'node:net';
import { ResponseCapture } from './response-capture.js';
import { hookResponse, showReports, type ResponseHook, type Through } from './response-hooks.js';
import { replayInto } from './response-replay.js';

/** An Express app's `response`: its prototype chain leads to Node's. */
const appResponse = Object.create(ServerResponse.prototype, { locals: { value: 'app', writable: true } }) as object;

let server: Server | undefined;
async function closeServer(): Promise<void> {
  const closing = server;
  server = undefined;
  if (!closing) return;
  closing.closeAllConnections();
  await new Promise((resolve) => closing.close(resolve));
}
afterEach(closeServer);

/** Serves one request with `handle` and returns what the client got. */
async function serve(handle: (res: ServerResponse) => void, Response?: new (req: IncomingMessage) => ServerResponse): Promise<{ status: number; body: string }> {
  server = Response ? createServer({ ServerResponse: Response as typeof ServerResponse }, (_req, res) => handle(res)) : createServer((_req, res) => handle(res));
  await new Promise<void>((resolve) => server!.listen(0, '127.0.0.1', resolve));
  const { port } = server.address() as AddressInfo;
  const response = await fetch(`http://127.0.0.1:${port}/`);
  return { status: response.status, body: await response.text() };
}

/** A hook that upper-cases what is written and counts its calls. */
function shouting(calls: string[], name = 'hook'): ResponseHook & { through?: Through } {
  const hook: ResponseHook & { through?: Through } = {
    writeHead(res, args) {
      calls.push(`${name}.writeHead`);
      return (hook.through!.writeHead as (...a: unknown[]) => ServerResponse).apply(res, args);
    },
    write(res, args) {
      calls.push(`${name}.write`);
      return (hook.through!.write as (...a: unknown[]) => boolean).call(res, String(args[0]).toUpperCase());
    },
    end(res, args) {
      calls.push(`${name}.end`);
      return (hook.through!.end as (...a: unknown[]) => ServerResponse).call(res, args[0] === undefined ? undefined : String(args[0]).toUpperCase());
    },
  };
  return hook;
}

/** What the guard may add: the methods and accessors it hooks, and its own symbols. */
const byTheGuard = (key: string | symbol) =>
  typeof key === 'symbol' ? String(key).includes('nestjs-idempotency') : ['writeHead', 'write', 'end', 'headersSent', 'writableEnded'].includes(key);
const ownKeys = (res: ServerResponse) => new Set(Reflect.ownKeys(res));
const added = (before: Set<string | symbol>, res: ServerResponse) => Reflect.ownKeys(res).filter((key) => !before.has(key));

describe('hookResponse', () => {
  it('puts the methods on a response built by its class (Fastify, plain Node), the same three functions on every response', async () => {
    const calls: string[] = [];
    const keys: (string | symbol)[][] = [];
    const methods: unknown[][] = [];
    for (const body of ['a', 'c']) {
      const got = await serve((res) => {
        const before = ownKeys(res);
        const hook = shouting(calls);
        hook.through = hookResponse(res, hook);
        keys.push(added(before, res));
        methods.push([res.writeHead, res.write, res.end]);
        res.writeHead(201, { 'content-type': 'text/plain' });
        res.write(body);
        res.end('b');
      });
      await closeServer();
      expect(got).toEqual({ status: 201, body: `${body.toUpperCase()}B` });
    }
    expect(calls).toEqual(['hook.writeHead', 'hook.write', 'hook.end', 'hook.writeHead', 'hook.write', 'hook.end']);
    for (const added of keys) {
      expect(added.filter((key) => typeof key === 'string')).toEqual(['writeHead', 'write', 'end']);
      expect(added.filter((key) => typeof key === 'symbol')).toHaveLength(1);
    }
    // No closure of its own per response: the collector kept what a hook holds past
    // young-generation collections while each response had its own (bench/README.md).
    expect(methods[1]).toEqual(methods[0]);
    expect(methods[1].every((method, i) => method === methods[0][i])).toBe(true);
  });

  it('adds one property to a prototype-swapped response (Express), whose prototype then finds the hook', async () => {
    const calls: string[] = [];
    let keys: (string | symbol)[] = [];
    let stillAResponse = false;
    let appMembers = '';
    const got = await serve((res) => {
      Object.setPrototypeOf(res, appResponse);
      const before = ownKeys(res);
      const hook = shouting(calls);
      hook.through = hookResponse(res, hook);
      keys = added(before, res);
      stillAResponse = res instanceof ServerResponse;
      appMembers = (res as ServerResponse & { locals: string }).locals;
      res.writeHead(201, { 'content-type': 'text/plain' });
      res.write('a');
      res.end('b');
    });
    expect(got).toEqual({ status: 201, body: 'AB' });
    expect(calls).toEqual(['hook.writeHead', 'hook.write', 'hook.end']);
    expect(keys).toHaveLength(1);
    expect(typeof keys[0]).toBe('symbol');
    expect(stillAResponse).toBe(true);
    expect(appMembers).toBe('app');
  });

  it('leaves an unhooked response of the same app as it was, after another one was hooked', async () => {
    await serve((res) => {
      Object.setPrototypeOf(res, appResponse);
      const hook = shouting([]);
      hook.through = hookResponse(res, hook);
      res.end('x');
    });
    await closeServer();
    const got = await serve((res) => {
      Object.setPrototypeOf(res, appResponse);
      res.end('plain');
    });
    expect(got.body).toBe('plain');
  });

  it("calls Node's setHeader as it is at each call, patched after the first hooked response (an APM agent)", async () => {
    // A prototype made for an app with a one-off parent, so that patching its setHeader touches no other test.
    const parent = Object.create(ServerResponse.prototype) as { setHeader: ServerResponse['setHeader'] };
    await serve((res) => {
      Object.setPrototypeOf(res, parent);
      const hook = shouting([]);
      hook.through = hookResponse(res, hook);
      res.end('x');
    });
    await closeServer();
    const patched: string[] = [];
    const original = ServerResponse.prototype.setHeader;
    parent.setHeader = function (this: ServerResponse, name: string, value: number | string | readonly string[]) {
      patched.push(name);
      return original.call(this, name, value);
    };
    const got = await serve((res) => {
      Object.setPrototypeOf(res, parent);
      const hook = shouting([]);
      hook.through = hookResponse(res, hook);
      res.setHeader('x-traced', '1');
      res.end('y');
    });
    expect(got.body).toBe('Y');
    expect(patched).toEqual(['x-traced']);
  });

  it("stands in front of a response's own methods (a compression middleware's), and of an earlier hook", async () => {
    for (const swap of [false, true]) {
      for (const middleware of [true, false]) {
        const calls: string[] = [];
        const got = await serve((res) => {
          if (swap) Object.setPrototypeOf(res, appResponse);
          if (middleware) {
            // A middleware's wrapper, set before the guard runs (compression does this).
            const nodeEnd = res.end;
            res.end = function (this: ServerResponse, ...args: unknown[]) {
              calls.push('middleware.end');
              return (nodeEnd as (...a: unknown[]) => ServerResponse).apply(this, args);
            } as ServerResponse['end'];
          }
          const first = shouting(calls, 'first');
          first.through = hookResponse(res, first);
          // A second run on the same response (an outer retry()).
          const second = shouting(calls, 'second');
          second.through = hookResponse(res, second);
          res.end('b');
        });
        await closeServer();
        expect(got.body).toBe('B');
        // Node's end() writes the implicit head through writeHead: the hooks see that too.
        expect(calls).toEqual(['second.end', 'first.end', ...(middleware ? ['middleware.end'] : []), 'second.writeHead', 'first.writeHead']);
      }
    }
  });

  it('lets a hook say what headersSent and writableEnded report, else Node answers', async () => {
    for (const swap of [false, true]) {
      const seen: boolean[] = [];
      await serve((res) => {
        if (swap) Object.setPrototypeOf(res, appResponse);
        const reported = { headersSent: false, writableEnded: false };
        const hook = Object.assign(shouting([]), { reported });
        hook.through = hookResponse(res, hook);
        showReports(res, hook);
        seen.push(res.headersSent, res.writableEnded);
        reported.headersSent = true;
        reported.writableEnded = true;
        seen.push(res.headersSent, res.writableEnded);
        reported.headersSent = false;
        reported.writableEnded = false;
        res.end('x');
        seen.push(res.headersSent, res.writableEnded);
      });
      await closeServer();
      expect(seen).toEqual([false, false, true, true, true, true]);
    }
  });
});

describe('showReports on a response built by its class (Fastify, plain Node)', () => {
  /** Hooks `res` with its own properties and shows `reported`: what the guard does on Fastify. */
  const hooked = (res: ServerResponse, reported: { headersSent: boolean; writableEnded: boolean }) => {
    const hook = Object.assign(shouting([]), { reported });
    hook.through = hookResponse(res, hook);
    showReports(res, hook);
  };

  it('gives every response whose header methods are its prototype\'s the same refusing functions, which call what the prototype has at each call', async () => {
    const seen: Array<ServerResponse['setHeader']> = [];
    const refused: string[] = [];
    for (let i = 0; i < 2; i++) {
      await serve((res) => {
        const reported = { headersSent: false, writableEnded: false };
        hooked(res, reported);
        seen.push(res.setHeader);
        res.setHeader('x-first', '1');
        reported.headersSent = true;
        try {
          res.setHeader('x-late', '1');
        } catch (error) {
          refused.push((error as { code?: string }).code ?? '');
        }
        reported.headersSent = false;
        res.end('x');
      });
      await closeServer();
    }
    expect(seen[0]).toBe(seen[1]);
    expect(seen[0]).not.toBe(ServerResponse.prototype.setHeader);
    expect(refused).toEqual(['ERR_HTTP_HEADERS_SENT', 'ERR_HTTP_HEADERS_SENT']);

    // An APM agent patching Node's setHeader after those responses: the next one's calls reach it.
    const patched: string[] = [];
    const original = ServerResponse.prototype.setHeader;
    class Traced extends ServerResponse {}
    Traced.prototype.setHeader = function (this: ServerResponse, name: string, value: number | string | readonly string[]) {
      patched.push(name);
      return original.call(this, name, value);
    };
    const got = await serve((res) => {
      hooked(res, { headersSent: false, writableEnded: false });
      res.setHeader('x-traced', '1');
      res.end('y');
    }, Traced);
    expect(got.body).toBe('Y');
    expect(patched).toEqual(['x-traced']);
  });

  it("keeps calling a response's own header method (a middleware's) put on before the guard", async () => {
    const calls: string[] = [];
    let refused = '';
    const got = await serve((res) => {
      const nodeSetHeader = res.setHeader;
      res.setHeader = function (this: ServerResponse, name: string, value: number | string | readonly string[]) {
        calls.push(`middleware.${name}`);
        return nodeSetHeader.call(this, name, value);
      } as ServerResponse['setHeader'];
      const reported = { headersSent: false, writableEnded: false };
      hooked(res, reported);
      res.setHeader('x-one', '1');
      reported.headersSent = true;
      try {
        res.setHeader('x-late', '1');
      } catch (error) {
        refused = (error as { code?: string }).code ?? '';
      }
      reported.headersSent = false;
      res.end('z');
    });
    expect(got.body).toBe('Z');
    expect(calls).toEqual(['middleware.x-one']);
    expect(refused).toBe('ERR_HTTP_HEADERS_SENT');
  });
});

describe('ResponseCapture on a prototype-swapped response (Express)', () => {
  it('adds one property to it, however much it holds and reports', async () => {
    let keys: (string | symbol)[] = [];
    let saved: string | undefined;
    const got = await serve((res) => {
      Object.setPrototypeOf(res, appResponse);
      const before = ownKeys(res);
      const capture = new ResponseCapture(res, ['content-type'], 1 << 20, 'nest', async (sent) => {
        saved = sent?.body?.toString();
      });
      capture.succeed();
      res.setHeader('content-type', 'text/plain');
      res.write('held ');
      res.end('then sent');
      keys = added(before, res).filter(byTheGuard);
    });
    expect(got).toEqual({ status: 200, body: 'held then sent' });
    expect(saved).toBe('held then sent');
    expect(keys).toHaveLength(1);
  });

  it('on a route whose handler answers (@Res()), still sees the answer after another Express app swapped the prototype again', async () => {
    // A @Res() handler may hand the request to a legacy express() app, which sets its own
    // app.response as the prototype (express/lib/application.js): the hook must not live there.
    const legacyResponse = Object.create(ServerResponse.prototype) as object;
    let saved: string | undefined;
    const got = await serve((res) => {
      Object.setPrototypeOf(res, appResponse);
      new ResponseCapture(res, ['content-type'], 1 << 20, 'handler', async (sent) => {
        saved = sent?.body?.toString();
      });
      res.statusCode = 201; // before the first write, which sends the head
      res.write('prefix-');
      Object.setPrototypeOf(res, legacyResponse);
      res.end('body');
    });
    expect(got).toEqual({ status: 201, body: 'prefix-body' });
    expect(saved).toBe('prefix-body');
  });
});

/**
 * A response whose end(data) writes `data` through `this.write()`, as light-my-request's does
 * (what Fastify's and Nest's `inject()` run). The test runner cannot load light-my-request itself
 * on Node 20 (it requires cookie 2, an ES module), so this class stands in for its Response:
 * the same three lines, on a real server.
 */
class EndWritesThroughWrite extends ServerResponse {
  override end(...args: unknown[]): this {
    const [data, encoding] = args;
    if (data !== undefined && typeof data !== 'function') this.write(data as string, encoding as BufferEncoding);
    return super.end(typeof args.at(-1) === 'function' ? (args.at(-1) as () => void) : undefined);
  }
}

describe('a response whose end(data) writes through this.write() (Fastify inject())', () => {
  it('gets the whole first answer, and the capture saves it', async () => {
    for (const handlerAnswers of ['nest', 'handler'] as const) {
      let saved: string | undefined;
      const got = await serve((res) => {
        const capture = new ResponseCapture(res, ['content-type'], 1 << 20, handlerAnswers, async (sent) => {
          saved = sent?.body?.toString();
        });
        capture.succeed();
        res.setHeader('content-type', 'text/plain');
        res.write('held ');
        res.end('then sent');
      }, EndWritesThroughWrite);
      await closeServer();
      expect(got).toEqual({ status: 200, body: 'held then sent' });
      expect(saved).toBe('held then sent');
    }
  });

  it('gets the whole replay, whatever the pipeline writes', async () => {
    const got = await serve((res) => {
      replayInto(res, { statusCode: 201, headers: { 'content-type': 'text/plain' }, body: 'the first answer' }, ['content-type']);
      res.setHeader('content-type', 'application/json');
      res.end('{"the":"pipeline\'s own"}');
    }, EndWritesThroughWrite);
    expect(got).toEqual({ status: 201, body: 'the first answer' });
  });
});
