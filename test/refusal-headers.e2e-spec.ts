import { afterAll, beforeAll, describe, expect, it } from '@jest/globals';
import {
  Body,
  Catch,
  ClassSerializerInterceptor,
  ConflictException,
  Controller,
  HttpException,
  Module,
  Post,
  RequestTimeoutException,
  StreamableFile,
  type ArgumentsHost,
  type CallHandler,
  type ExceptionFilter,
  type ExecutionContext,
  type INestApplication,
  type NestInterceptor,
} from '@nestjs/common';
import { APP_INTERCEPTOR, HttpAdapterHost, NestFactory, Reflector } from '@nestjs/core';
import { ExpressAdapter } from '@nestjs/platform-express';
import { FastifyAdapter } from '@nestjs/platform-fastify';
import { randomUUID } from 'node:crypto';
import { Agent, type ServerResponse } from 'node:http';
import { catchError, of, retry, throwError, timeout, TimeoutError, type Observable } from 'rxjs';
import { IdempotencyModule, NoRepeatSubmit, type IdempotencyEvent } from '../libs/idempotency/src/index.js';
import { send, until, type RawAnswer } from './support/edge-app.js';
import { REDIS_URL } from './support/services.js';

/**
 * The problem+json Content-Type (and Retry-After) the guard sets on the response
 * before it throws a refusal must not reach an answer that is not that refusal.
 */

/** Nest docs' TimeoutInterceptor. */
class TimeoutInterceptor implements NestInterceptor {
  intercept(_ctx: ExecutionContext, next: CallHandler): Observable<unknown> {
    return next.handle().pipe(
      timeout(5000),
      catchError((err) => throwError(() => (err instanceof TimeoutError ? new RequestTimeoutException() : err))),
    );
  }
}

/** A "resilience" interceptor: retries a failed call after a short pause. */
class RetryInterceptor implements NestInterceptor {
  intercept(_ctx: ExecutionContext, next: CallHandler): Observable<unknown> {
    return next.handle().pipe(retry({ count: 2, delay: 250 }));
  }
}

/** Answers a duplicate in flight as "202 pending" instead of the guard's 409. */
class PendingInterceptor implements NestInterceptor {
  intercept(ctx: ExecutionContext, next: CallHandler): Observable<unknown> {
    // With `x-pending-stream`, the answer is a stream (Fastify copies its headers onto the Node.js response for one).
    const streamed = ctx.switchToHttp().getRequest<{ headers: Record<string, string | undefined> }>().headers['x-pending-stream'];
    return next.handle().pipe(
      catchError((err: unknown) =>
        err instanceof ConflictException || (err instanceof HttpException && err.getStatus() === 409)
          ? of(streamed ? new StreamableFile(Buffer.from('pending'), { type: 'text/plain' }) : { pending: true })
          : throwError(() => err),
      ),
    );
  }
}

/**
 * Answers the guard's 409 as 429 "slow down"; with `x-copy-retry-after` on the request, it sets
 * its own Retry-After first, to the value it reads on the response (the guard's, as many such
 * filters pass it on).
 */
@Catch(HttpException)
class SlowDownFilter implements ExceptionFilter {
  constructor(private readonly adapterHost: HttpAdapterHost) {}

  catch(exception: HttpException, host: ArgumentsHost) {
    const { httpAdapter } = this.adapterHost;
    const req = host.switchToHttp().getRequest<{ headers: Record<string, string | undefined> }>();
    const res = host.switchToHttp().getResponse<{ getHeader(name: string): unknown; raw?: ServerResponse }>();
    if (exception.getStatus() !== 409) return httpAdapter.reply(res, exception.getResponse(), exception.getStatus());
    const node = res.raw ?? (res as unknown as ServerResponse);
    if (req.headers['x-copy-retry-after']) httpAdapter.setHeader(res, 'Retry-After', String(res.getHeader('retry-after')));
    // On the Node.js response itself (Fastify's reply.raw), as code written for Express does.
    if (req.headers['x-node-retry-after']) node.setHeader('Retry-After', req.headers['x-node-retry-after']);
    if (req.headers['x-failed-retry-after']) {
      try {
        node.setHeader('Retry-After', undefined as unknown as string); // a value from a missing setting: Node refuses it
      } catch {
        // the filter goes on without one
      }
    }
    if (req.headers['x-keep-409']) return httpAdapter.reply(res, exception.getResponse(), 409);
    httpAdapter.reply(res, { error: 'slow down' }, 429);
  }
}

let gate: { promise: Promise<void>; open: () => void } = { promise: Promise.resolve(), open: () => undefined };
const newGate = () => {
  let open = () => undefined as void;
  const promise = new Promise<void>((resolve) => (open = resolve));
  gate = { promise, open };
};
let failNext = false;
let runs = 0;
const events: IdempotencyEvent[] = [];

@Controller()
class PaymentsController {
  /** Waits at the gate; the first run after `failNext` fails (a transient error: the key is released). */
  @Post('payments')
  @NoRepeatSubmit()
  async pay(@Body() body: { amount: number }) {
    runs++;
    await gate.promise;
    if (failNext) {
      failNext = false;
      throw new HttpException({ statusCode: 503, message: 'bank busy' }, 503);
    }
    return { paid: body.amount, run: runs };
  }

  @Post('plain')
  @NoRepeatSubmit()
  plain(@Body() body: unknown) {
    return { body };
  }
}

async function start(
  adapter: 'express' | 'fastify',
  outer: 'retry' | 'pending' | 'slow-down filter',
  errorFormat: 'nest' | 'problem+json' = 'problem+json',
): Promise<{ app: INestApplication; url: string }> {
  const interceptors = { retry: [RetryInterceptor], pending: [PendingInterceptor], 'slow-down filter': [] }[outer];
  @Module({
    imports: [
      IdempotencyModule.forRoot({
        store: { redis: REDIS_URL },
        keyPrefix: `refusal-headers-${randomUUID().slice(0, 8)}`,
        errorFormat,
        onEvent: (event) => {
          events.push(event);
        },
      }),
    ],
    controllers: [PaymentsController],
    providers: interceptors.map((useClass) => ({ provide: APP_INTERCEPTOR, useClass })),
  })
  class AppModule {}
  const app = await NestFactory.create(AppModule, adapter === 'fastify' ? new FastifyAdapter() : new ExpressAdapter(), { logger: false });
  app.useGlobalInterceptors(new ClassSerializerInterceptor(app.get(Reflector)), new TimeoutInterceptor());
  if (outer === 'slow-down filter') app.useGlobalFilters(new SlowDownFilter(app.get(HttpAdapterHost)));
  // A middleware that sets a Retry-After of its own on the way in, before any guard (on Fastify, on the Node.js response).
  app.use((req: { headers: Record<string, string | undefined> }, res: ServerResponse, next: () => void) => {
    if (req.headers['x-early-retry-after']) res.setHeader('Retry-After', req.headers['x-early-retry-after']);
    next();
  });
  await app.listen(0, '127.0.0.1');
  return { app, url: `http://127.0.0.1:${(app.getHttpServer().address() as { port: number }).port}` };
}

const contentType = (answer: RawAnswer) => answer.headers['content-type'];

/** A duplicate sent to `url` while the first request holds its key: the duplicate's answer, once the first answered 201. */
async function duplicateInFlight(url: string, amount: number, headers: Record<string, string> = {}): Promise<RawAnswer> {
  const key = randomUUID();
  newGate();
  failNext = false;
  events.length = 0;
  const first = send(url, '/payments', { key, body: { amount } });
  await until(() => events.some((e) => e.type === 'acquired'));
  const duplicate = await send(url, '/payments', { key, body: { amount }, headers });
  gate.open();
  expect((await first).status).toBe(201);
  return duplicate;
}

describe.each(['express', 'fastify'] as const)('refusal headers (problem+json, Retry-After) on answers that are not refusals (%s)', (adapter) => {
  describe('under an outer retry interceptor', () => {
    let app: INestApplication;
    let url: string;
    beforeAll(async () => {
      ({ app, url } = await start(adapter, 'retry'));
    });
    afterAll(async () => app?.close());

    /** A duplicate refused in progress while the first run fails, then run by the retry: both answers. */
    async function retriedDuplicate(amount: number, headers: Record<string, string> = {}) {
      const key = randomUUID();
      newGate();
      failNext = true;
      events.length = 0;
      const first = send(url, '/payments', { key, body: { amount }, headers, timeoutMs: 8000 });
      await until(() => events.some((e) => e.type === 'acquired'));
      const duplicate = send(url, '/payments', { key, body: { amount }, headers, timeoutMs: 8000 });
      await until(() => events.some((e) => e.type === 'in_progress'));
      gate.open();
      return Promise.all([first, duplicate]);
    }

    it('a duplicate refused 409 in progress, then run by the retry after the first failed, answers 201 as application/json, and its replay too', async () => {
      const key = randomUUID();
      newGate();
      failNext = true;
      events.length = 0;
      const first = send(url, '/payments', { key, body: { amount: 5 }, timeoutMs: 8000 });
      await until(() => runs > 0 && events.some((e) => e.type === 'acquired'));
      const startedRuns = runs;
      const duplicate = send(url, '/payments', { key, body: { amount: 5 }, timeoutMs: 8000 });
      // The duplicate was refused once (in progress) and its retry is pending: now the first run fails.
      await until(() => events.some((e) => e.type === 'in_progress'));
      gate.open();
      const [a, b] = await Promise.all([first, duplicate]);
      expect(runs).toBeGreaterThan(startedRuns);
      const ran = [a, b].find((answer) => answer.status === 201 && answer.headers['idempotent-replayed'] === undefined)!;
      expect(ran).toBeDefined();
      const replay = await send(url, '/payments', { key, body: { amount: 5 } });
      // Before the fix: the duplicate's own run went out 201 as application/problem+json, and the record saved
      // that header, so every replay of the payment says problem+json too.
      expect({
        duplicate: [b.status, b.headers['idempotent-replayed'], contentType(b)],
        replay: [replay.status, replay.headers['idempotent-replayed'], contentType(replay)],
      }).toEqual({
        duplicate: [201, undefined, expect.stringMatching(/^application\/json/)],
        replay: [201, 'true', expect.stringMatching(/^application\/json/)],
      });
    });

    it('the same retried 201 carries no Retry-After (a header of the refusal it superseded)', async () => {
      const [, b] = await retriedDuplicate(6);
      expect(b.status).toBe(201);
      expect(b.headers['retry-after']).toBeUndefined();
    });

    // helper-227: on Fastify, the guard took its own back from the reply with reply.removeHeader,
    // which removes the Node.js response's too: the middleware's 99 was lost, in the record too.
    it('the same retried 201 carries the Retry-After a middleware set before the refusal', async () => {
      const [, b] = await retriedDuplicate(17, { 'x-early-retry-after': '99' });
      expect([b.status, b.headers['idempotent-replayed'], b.headers['retry-after']]).toEqual([201, undefined, '99']);
    });

    it('regression: a duplicate still in progress after every retry is answered as the refusal: 409 problem+json with Retry-After', async () => {
      const key = randomUUID();
      newGate();
      failNext = false;
      events.length = 0;
      const first = send(url, '/payments', { key, body: { amount: 8 }, timeoutMs: 8000 });
      await until(() => events.some((e) => e.type === 'acquired'));
      const duplicate = await send(url, '/payments', { key, body: { amount: 8 }, timeoutMs: 8000 });
      gate.open();
      expect((await first).status).toBe(201);
      expect([duplicate.status, contentType(duplicate), duplicate.headers['retry-after']]).toEqual([
        409,
        expect.stringMatching(/^application\/problem\+json/),
        expect.stringMatching(/^[12]$/),
      ]);
      expect(JSON.parse(duplicate.text)).toMatchObject({ status: 409, code: 'IDEMPOTENCY_IN_PROGRESS' });
    });
  });

  describe('in the default format, under an outer retry interceptor', () => {
    let app: INestApplication;
    let url: string;
    beforeAll(async () => {
      ({ app, url } = await start(adapter, 'retry', 'nest'));
    });
    afterAll(async () => app?.close());

    it('the 201 of a duplicate the retry ran carries no Retry-After, nor does its replay', async () => {
      const key = randomUUID();
      newGate();
      failNext = true;
      events.length = 0;
      const first = send(url, '/payments', { key, body: { amount: 9 }, timeoutMs: 8000 });
      await until(() => events.some((e) => e.type === 'acquired'));
      const duplicate = send(url, '/payments', { key, body: { amount: 9 }, timeoutMs: 8000 });
      await until(() => events.some((e) => e.type === 'in_progress'));
      gate.open();
      const [, b] = await Promise.all([first, duplicate]);
      const replay = await send(url, '/payments', { key, body: { amount: 9 } });
      // Before the fix: Retry-After: 2 on the 201 (in the 'nest' format too, before problem+json existed).
      expect([b.status, b.headers['retry-after'], contentType(b)]).toEqual([201, undefined, expect.stringMatching(/^application\/json/)]);
      expect([replay.status, replay.headers['idempotent-replayed'], replay.headers['retry-after']]).toEqual([201, 'true', undefined]);
    });
  });

  describe('under an outer interceptor that answers a duplicate in flight itself', () => {
    let app: INestApplication;
    let url: string;
    beforeAll(async () => {
      ({ app, url } = await start(adapter, 'pending'));
    });
    afterAll(async () => app?.close());

    it('its 201 { pending: true } goes out as application/json, not as problem details', async () => {
      const duplicate = await duplicateInFlight(url, 7);
      expect(JSON.parse(duplicate.text)).toEqual({ pending: true });
      // Before the fix: Content-Type: application/problem+json on { pending: true }.
      expect(contentType(duplicate)).toMatch(/^application\/json/);
    });

    // helper-228: Fastify copies a stream's headers onto the Node.js response one by one, which the
    // guard took for the app's own: Retry-After: 2 on the 201.
    it('its streamed answer carries no Retry-After, and a middleware\'s comes back', async () => {
      const streamedIn = async (amount: number, headers: Record<string, string>) => {
        const duplicate = await duplicateInFlight(url, amount, { 'x-pending-stream': '1', ...headers });
        return [duplicate.status, duplicate.text, duplicate.headers['retry-after']];
      };
      // Its type is application/json, not the stream's: the adapter sets a stream's type only where none is set (README).
      expect({ plain: await streamedIn(19, {}), afterMiddleware: await streamedIn(20, { 'x-early-retry-after': '99' }) }).toEqual({
        plain: [201, 'pending', undefined],
        afterMiddleware: [201, 'pending', '99'],
      });
    });

    it('its { pending: true } carries no Retry-After either, in the default format too', async () => {
      const pendingIn = async (target: string, amount: number) => {
        const duplicate = await duplicateInFlight(target, amount);
        return [duplicate.status, JSON.parse(duplicate.text), duplicate.headers['retry-after'], contentType(duplicate)];
      };
      const nest = await start(adapter, 'pending', 'nest');
      try {
        const expected = [201, { pending: true }, undefined, expect.stringMatching(/^application\/json/)];
        expect({ problem: await pendingIn(url, 10), nest: await pendingIn(nest.url, 11) }).toEqual({ problem: expected, nest: expected });
      } finally {
        await nest.app.close();
      }
    });

    it('regression: a refusal, then a 2xx on the same keep-alive connection: the 2xx is application/json', async () => {
      const agent = new Agent({ keepAlive: true, maxSockets: 1 });
      try {
        const refused = await send(url, '/plain', { body: { a: 1 }, agent });
        expect([refused.status, contentType(refused)]).toEqual([400, expect.stringMatching(/^application\/problem\+json/)]);
        const ok = await send(url, '/plain', { key: randomUUID(), body: { a: 1 }, agent });
        expect([ok.status, contentType(ok)]).toEqual([201, expect.stringMatching(/^application\/json/)]);
      } finally {
        agent.destroy();
      }
    });
  });

  describe('under an exception filter that answers the guard\'s 409 as 429', () => {
    let app: INestApplication;
    let url: string;
    beforeAll(async () => {
      ({ app, url } = await start(adapter, 'slow-down filter'));
    });
    afterAll(async () => app?.close());

    /** A duplicate sent while the first request runs: what the filter answered it. */
    const slowedDown = (amount: number, headers: Record<string, string>) => duplicateInFlight(url, amount, headers);

    it('keeps the Retry-After the filter set itself, though its value is the refusal\'s', async () => {
      const duplicate = await slowedDown(12, { 'x-copy-retry-after': '1' });
      // Before the fix: taken back as the refusal's (the same value), the 429 went out without it.
      expect([duplicate.status, JSON.parse(duplicate.text), duplicate.headers['retry-after']]).toEqual([429, { error: 'slow down' }, expect.stringMatching(/^[12]$/)]);
    });

    // helper-225: on Fastify the refusal's value stayed in the reply's headers, which go out over the Node response's.
    it('sends the Retry-After the filter set on the Node.js response itself', async () => {
      const duplicate = await slowedDown(14, { 'x-node-retry-after': '30' });
      expect([duplicate.status, duplicate.headers['retry-after']]).toEqual([429, '30']);
    });

    // helper-225: the guard took the header for the app's before the call, which threw.
    it('carries no Retry-After where the filter tried to set one and Node refused it', async () => {
      const duplicate = await slowedDown(15, { 'x-failed-retry-after': '1' });
      expect([duplicate.status, duplicate.headers['retry-after']]).toEqual([429, undefined]);
    });

    // helper-227: on Fastify the refusal's value in the reply's headers went out over the app's.
    it('sends the Retry-After the filter set on the Node.js response when it keeps the 409', async () => {
      const duplicate = await slowedDown(18, { 'x-keep-409': '1', 'x-node-retry-after': '30' });
      expect([duplicate.status, duplicate.headers['retry-after']]).toEqual([409, '30']);
    });

    // helper-225: the refusal's value replaced the middleware's, and was taken back with it (Express).
    it("gives back the Retry-After a middleware set before the refusal replaced it", async () => {
      const duplicate = await slowedDown(16, { 'x-early-retry-after': '99' });
      expect([duplicate.status, duplicate.headers['retry-after']]).toEqual([429, '99']);
    });

    it('regression: a 429 whose filter set none carries no Retry-After (the refusal\'s is taken back)', async () => {
      const duplicate = await slowedDown(13, {});
      expect([duplicate.status, duplicate.headers['retry-after']]).toEqual([429, undefined]);
    });
  });
});
