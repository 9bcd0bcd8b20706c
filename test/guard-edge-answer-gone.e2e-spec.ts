// A handler that touches its response after the answer has gone out, on Express, where Node
// refuses it (`ERR_HTTP_HEADERS_SENT`):
// - an outer timeout (an app-wide `timeout()` interceptor, or a timeout middleware) answered
//   first, and the handler, done with its work, then sets a header through
//   `@Res({ passthrough: true })`. The throw reached the guard as a failed handler, which released
//   the key: every timed-out retry ran the handler again (an adversarial helper: 10 of 10 keys ran
//   4 times in 4 attempts). Once another answer went out while the handler ran, its late header
//   changes are dropped (as Fastify's reply.header() drops them), not thrown: it succeeds, and is
//   recorded as never delivered. Telling such throws apart by their error code was tried and
//   dropped: a handler that failed for real and rolled back, with one of those codes, kept its
//   key (every retry 409, the write never made), and one that wrapped the error ran twice;
// - a handler that answers twice (`res.send(a)` then `res.json(b)`, or a passthrough handler that
//   sends and also returns a value): without the guard Node refuses the second answer's headers
//   and the first goes out whole. The guard held the first answer's bytes and let the second's
//   headers through, so the first client got one answer's bytes under the other's
//   `Content-Length` (a stalled or unparsable response; an adversarial helper, 5 of 5).
import { afterAll, beforeAll, describe, expect, it } from '@jest/globals';
import {
  Body,
  Controller,
  Post,
  RequestTimeoutException,
  Res,
  type CallHandler,
  type ExecutionContext,
  type NestInterceptor,
} from '@nestjs/common';
import { APP_INTERCEPTOR } from '@nestjs/core';
import { randomUUID } from 'node:crypto';
import { EventEmitter } from 'node:events';
import type { IncomingMessage, ServerResponse } from 'node:http';
import { catchError, throwError, timeout, TimeoutError, type Observable } from 'rxjs';
import { NoRepeatSubmit } from '../libs/idempotency/src/index.js';
import { REDIS_URL } from './support/services.js';
import { codeOf, makeApp, replayed, send, until, type EdgeApp, type RawAnswer } from './support/edge-app.js';

type ExpressRes = ServerResponse & {
  header(name: string, value: string): void;
  send(body: unknown): void;
  json(body: unknown): void;
  redirect(url: string): void;
  status(code: number): ExpressRes;
};

/** The Nest docs' timeout interceptor. */
class TimeoutInterceptor implements NestInterceptor {
  intercept(_ctx: ExecutionContext, next: CallHandler): Observable<unknown> {
    return next.handle().pipe(
      timeout(200),
      catchError((error: unknown) => throwError(() => (error instanceof TimeoutError ? new RequestTimeoutException() : error))),
    );
  }
}

function requestTimeout(ms: number) {
  return (req: IncomingMessage, res: ExpressRes, next: () => void) => {
    if (!req.url?.startsWith('/late/middleware')) return next();
    const timer = setTimeout(() => {
      if (!res.headersSent) res.status(503).json({ error: 'request timed out' });
    }, ms);
    res.on('close', () => clearTimeout(timer));
    next();
  };
}

const runs = new Map<string, number>();
const ran = (name: string) => {
  runs.set(name, (runs.get(name) ?? 0) + 1);
  return runs.get(name)!;
};
/** The late handlers wait here until the test has read the timeout's answer (20 s at most). */
let gate: Promise<void> = Promise.resolve();
let open: () => void = () => undefined;
const closeGate = () => {
  gate = new Promise<void>((resolve) => {
    open = resolve;
    setTimeout(resolve, 20_000).unref();
  });
};
/** What the second answer's call did, per route. */
const refused = new Map<string, string>();

@Controller('late')
class LateController {
  @Post('interceptor')
  @NoRepeatSubmit()
  async interceptor(@Res({ passthrough: true }) res: ExpressRes) {
    await gate;
    const n = ran('interceptor');
    res.header('location', `/orders/${n}`); // throws: the 408 has gone out
    return { order: n };
  }

  @Post('middleware')
  @NoRepeatSubmit()
  async middleware(@Res({ passthrough: true }) res: ExpressRes) {
    await gate;
    const n = ran('middleware');
    res.header('location', `/orders/${n}`); // threw: the 503 has gone out
    return { order: n };
  }

  /** Sets a cookie after its work, and wraps what that throws (a handler's own error). */
  @Post('wrapped')
  @NoRepeatSubmit()
  async wrapped(@Res({ passthrough: true }) res: ExpressRes & { cookie(name: string, value: string): void }) {
    await gate;
    const n = ran('wrapped');
    try {
      res.cookie('order', String(n));
    } catch (error) {
      throw new Error('could not finish the order response', { cause: error });
    }
    return { order: n };
  }

  /** Fails for real after a timeout middleware answered, having set a header (a passthrough route). */
  @Post('middleware-fails')
  @NoRepeatSubmit()
  async middlewareFails(@Res({ passthrough: true }) res: ExpressRes) {
    await gate;
    ran('middleware-fails');
    res.header('x-after', '1');
    throw new Error('the payment was declined');
  }

  /** Gives up, its work undone, when it finds its answer gone (a passthrough route). */
  @Post('middleware-gives-up')
  @NoRepeatSubmit()
  async middlewareGivesUp(@Res({ passthrough: true }) res: ExpressRes) {
    await gate;
    ran('middleware-gives-up');
    if (res.headersSent) throw new Error('the answer went out: rolled back');
    return { done: true };
  }

  /** Fails for real after the timeout answered, its work undone, with a code Node gives a stream written after its end. */
  @Post('fails')
  @NoRepeatSubmit()
  async fails(@Body() body: { fail?: boolean }) {
    await gate;
    ran('fails');
    if (body.fail) throw Object.assign(new Error('the export stream was ended'), { code: 'ERR_STREAM_WRITE_AFTER_END' });
    return { done: true };
  }
}

@Controller('twice')
class TwiceController {
  @Post('send-json')
  @NoRepeatSubmit()
  sendJson(@Res() res: ExpressRes) {
    this.unguardedSendJson(res, 'send-json');
  }

  @Post('unguarded-send-json')
  unguardedSendJson(@Res() res: ExpressRes, name = 'unguarded-send-json') {
    res.send(`first body ${ran(name)}`);
    try {
      res.json({ second: 'a body longer than the first' });
    } catch (error) {
      refused.set(name, (error as { code?: string }).code ?? String(error));
    }
  }

  /** Ends its answer, then sets another status and tries a second answer (a timeout middleware's end() racing the handler's answer). */
  @Post('status-after-end')
  @NoRepeatSubmit()
  statusAfterEnd(@Res() res: ExpressRes) {
    this.unguardedStatusAfterEnd(res, 'status-after-end');
  }

  @Post('unguarded-status-after-end')
  unguardedStatusAfterEnd(@Res() res: ExpressRes, name = 'unguarded-status-after-end') {
    ran(name);
    res.statusCode = 503;
    res.setHeader('content-type', 'application/json');
    res.end('{"timeout":true}');
    try {
      res.status(201).json({ order: 1 });
    } catch (error) {
      refused.set(name, (error as { code?: string }).code ?? String(error));
    }
  }

  @Post('send-return')
  @NoRepeatSubmit()
  sendReturn(@Res({ passthrough: true }) res: ExpressRes) {
    res.send(`sent by res ${ran('send-return')}`);
    return { returned: true };
  }

  @Post('redirect-return')
  @NoRepeatSubmit()
  redirectReturn(@Res({ passthrough: true }) res: ExpressRes) {
    ran('redirect-return');
    res.redirect('/elsewhere');
    return { returned: true };
  }
}

/** Made before any request, as a shared client's or a queue's events are: its callbacks run outside any request's async context. */
const bus = new EventEmitter();
setInterval(() => bus.emit('tick'), 10).unref();

@Controller('callback')
class CallbackController {
  /** A @Res() handler that answers from such a callback. */
  @Post('answers')
  @NoRepeatSubmit()
  async answers(@Res() res: ExpressRes) {
    const n = ran('callback-answers');
    await new Promise<void>((done) => bus.once('tick', () => (res.status(201).json({ order: n }), done())));
  }

  /** The same, failing after its answer went out (an audit write that fails). */
  @Post('answers-then-fails')
  @NoRepeatSubmit()
  async answersThenFails(@Res() res: ExpressRes) {
    const n = ran('callback-fails');
    await new Promise<void>((_done, fail) => bus.once('tick', () => (res.status(201).json({ order: n }), fail(new Error('audit failed')))));
  }
}

/**
 * A call whose handler waits at the gate while a timeout answers it, then the handler's end (run
 * `name` counted once more), then the first retry with its key that is no longer in progress
 * (the run's outcome has landed).
 */
async function timedOutThenRetried(
  url: string,
  path: string,
  name: string,
  body: unknown,
): Promise<{ first: RawAnswer; retry: RawAnswer; before: number; key: string }> {
  const before = runs.get(name) ?? 0;
  const key = randomUUID();
  closeGate();
  const first = await send(url, path, { key, body });
  open();
  await until(() => runs.get(name) === before + 1, 5000, 'the handler to finish');
  let retry!: RawAnswer;
  await until(async () => {
    retry = await send(url, path, { key, body });
    return codeOf(retry) !== 'IDEMPOTENCY_IN_PROGRESS';
  }, 5000);
  return { first, retry, before, key };
}

/** The answer arrived whole: no error, and as many bytes as its Content-Length says. */
const whole = (answer: RawAnswer) => ({ error: answer.error, length: Number(answer.headers['content-length']), bytes: answer.body.length });

describe.each(['memory', 'redis'] as const)('an Express handler that touches its response after its answer went out (%s store)', (store) => {
  let a: EdgeApp;
  beforeAll(async () => {
    const options = store === 'redis' ? { store: { redis: REDIS_URL }, keyPrefix: `answer-gone-${randomUUID()}` } : {};
    a = await makeApp('express', [LateController, TwiceController, CallbackController], options, {
      providers: [{ provide: APP_INTERCEPTOR, useClass: TimeoutInterceptor }],
      setup: (app) => void app.use(requestTimeout(200)),
    });
  });
  afterAll(async () => {
    open();
    await a?.close();
  });

  it.each([
    ['interceptor', 408],
    ['middleware', 503],
    ['wrapped', 408],
  ])('records a handler that set a header after an outer timeout (%s) answered as run, never delivered: retries do not run it again', async (name, status) => {
    const { first, retry, before, key } = await timedOutThenRetried(a.url, `/late/${name}`, name, { amount: 5 });
    const retries = [retry];
    for (let i = 0; i < 2; i++) retries.push(await send(a.url, `/late/${name}`, { key, body: { amount: 5 } }));
    expect(first.status).toBe(status);
    expect(retries.map((r) => [r.status, codeOf(r)])).toEqual(Array(3).fill([409, 'IDEMPOTENCY_RESPONSE_NOT_REPLAYABLE']));
    expect(runs.get(name)).toBe(before + 1);
  });

  // On a passthrough route the middleware's 503 was taken for the handler's own answer and saved
  // (5xx, not replayable): a handler that then failed kept its key, every retry 409 for the
  // key's retention (an adversarial helper, both adapters).
  it.each(['middleware-fails', 'middleware-gives-up'])(
    'releases the key of a passthrough handler that fails after a timeout middleware answered (%s): the retry runs',
    async (name) => {
      const { first, before } = await timedOutThenRetried(a.url, `/late/${name}`, name, { amount: 5 });
      expect(first.status).toBe(503);
      expect(runs.get(name)).toBe(before + 2);
    },
  );

  it('releases the key of a handler that failed after an outer timeout answered, whatever its error code: the retry runs', async () => {
    const { first, retry, before } = await timedOutThenRetried(a.url, '/late/fails', 'fails', { fail: true });
    expect(first.status).toBe(408);
    expect({ status: retry.status, code: codeOf(retry) }).toEqual({ status: 500, code: undefined });
    expect(runs.get('fails')).toBe(before + 2);
  });

  // Taken for another's answer (the callback runs outside the handler's async context), the first
  // answer was refused to every duplicate (409, not replayable), and a handler that then failed
  // released its key: every retry ran it again (an adversarial helper, both adapters). On a route
  // whose handler sends its own answer (@Res() without passthrough), every answer while it runs is its own.
  it.each([
    ['answers', 'callback-answers'],
    ['answers-then-fails', 'callback-fails'],
  ])('replays what a @Res() handler sent from a callback outside its run (%s), and runs it once', async (route, name) => {
    const before = runs.get(name) ?? 0;
    const key = randomUUID();
    const first = await send(a.url, `/callback/${route}`, { key });
    const again: RawAnswer[] = [];
    for (let i = 0; i < 3; i++) again.push(await send(a.url, `/callback/${route}`, { key }));
    expect(first.status).toBe(201);
    expect(again.map((answer) => [answer.status, answer.text, replayed(answer)])).toEqual(Array(3).fill([201, first.text, true]));
    expect(runs.get(name)).toBe(before + 1);
  });

  it('(control, no guard) a second answer is refused by Node, and the first goes out whole', async () => {
    const answer = await send(a.url, '/twice/unguarded-send-json');
    expect(whole(answer)).toEqual({ error: undefined, length: answer.body.length, bytes: answer.body.length });
    expect(answer.text).toMatch(/^first body \d+$/);
    expect(refused.get('unguarded-send-json')).toBe('ERR_HTTP_HEADERS_SENT');
  });

  it('sends the first of two answers whole, refuses the second as Node does, and replays the first', async () => {
    const key = randomUUID();
    const first = await send(a.url, '/twice/send-json', { key });
    const again = await send(a.url, '/twice/send-json', { key });
    expect({ status: first.status, ...whole(first), text: first.text }).toEqual({
      status: 201,
      error: undefined,
      length: first.body.length,
      bytes: first.body.length,
      text: expect.stringMatching(/^first body \d+$/),
    });
    expect(refused.get('send-json')).toBe('ERR_HTTP_HEADERS_SENT');
    expect({ status: again.status, text: again.text, replayed: replayed(again) }).toEqual({ status: 201, text: first.text, replayed: true });
  });

  // The held end() went out with the status set after it: a 201 carrying the first answer's body
  // (an adversarial helper: a timeout middleware racing a @Res() handler, up to 13 of 40 keys).
  it.each(['unguarded-status-after-end', 'status-after-end'])('sends an ended answer with the status it ended with, whatever is set after (%s)', async (route) => {
    const answer = await send(a.url, `/twice/${route}`, { key: randomUUID() });
    expect({ status: answer.status, body: answer.text, ...whole(answer) }).toEqual({
      status: 503,
      body: '{"timeout":true}',
      error: undefined,
      length: answer.body.length,
      bytes: answer.body.length,
    });
    expect(refused.get(route)).toBe('ERR_HTTP_HEADERS_SENT');
  });

  it.each([
    ['send-return', 201, /^sent by res \d+$/],
    ['redirect-return', 302, /Redirecting to \/elsewhere/],
  ])('sends a passthrough handler\'s own answer whole when it also returns a value (%s), and replays it', async (name, status, text) => {
    const key = randomUUID();
    const first = await send(a.url, `/twice/${name}`, { key });
    const again = await send(a.url, `/twice/${name}`, { key });
    expect({ status: first.status, ...whole(first) }).toEqual({ status, error: undefined, length: first.body.length, bytes: first.body.length });
    expect(first.text).toMatch(text);
    expect({ status: again.status, text: again.text, replayed: replayed(again) }).toEqual({ status, text: first.text, replayed: true });
  });
});

type FastifyReplyLike = { sent: boolean; code(status: number): FastifyReplyLike; header(name: string, value: string): FastifyReplyLike; send(body: unknown): void };

@Controller('late')
class FastifyLateController {
  @Post('middleware-fails')
  @NoRepeatSubmit()
  async middlewareFails(@Res({ passthrough: true }) reply: FastifyReplyLike) {
    await gate;
    ran('fastify-middleware-fails');
    reply.header('x-after', '1');
    throw new Error('the payment was declined');
  }

  @Post('middleware-gives-up')
  @NoRepeatSubmit()
  async middlewareGivesUp(@Res({ passthrough: true }) reply: FastifyReplyLike) {
    await gate;
    ran('fastify-middleware-gives-up');
    if (reply.sent) throw new Error('the answer went out: rolled back');
    return { done: true };
  }
}

describe('a Fastify passthrough handler that fails after a timeout hook answered', () => {
  let a: EdgeApp;
  beforeAll(async () => {
    a = await makeApp('fastify', [FastifyLateController], {}, {
      setup: (app) => {
        const fastify = app.getHttpAdapter().getInstance() as {
          addHook(name: 'onRequest', hook: (req: { url: string }, reply: FastifyReplyLike, done: () => void) => void): void;
        };
        fastify.addHook('onRequest', (req, reply, done) => {
          if (req.url.startsWith('/late/')) {
            setTimeout(() => {
              if (!reply.sent) reply.code(503).header('retry-after', '2').send({ error: 'request timed out' });
            }, 200).unref();
          }
          done();
        });
      },
    });
  });
  afterAll(async () => {
    open();
    await a?.close();
  });

  it.each(['middleware-fails', 'middleware-gives-up'])('releases its key (%s): the retry runs', async (route) => {
    const name = `fastify-${route}`;
    const { first, before } = await timedOutThenRetried(a.url, `/late/${route}`, name, { amount: 5 });
    expect(first.status).toBe(503);
    expect(runs.get(name)).toBe(before + 2);
  });
});
