import { afterAll, beforeAll, describe, expect, it } from '@jest/globals';
import {
  Body,
  Catch,
  Controller,
  HttpException,
  Injectable,
  Module,
  Post,
  UseGuards,
  type ArgumentsHost,
  type CanActivate,
  type ExceptionFilter,
  type ExecutionContext,
  type INestApplication,
} from '@nestjs/common';
import { HttpAdapterHost, NestFactory } from '@nestjs/core';
import { ExpressAdapter } from '@nestjs/platform-express';
import { FastifyAdapter } from '@nestjs/platform-fastify';
import { randomUUID } from 'node:crypto';
import {
  ContentDigest,
  IdempotencyHttpException,
  IdempotencyModule,
  NoRepeatSubmit,
  type IdempotencyModuleOptions,
} from '../libs/idempotency/src/index.js';
import { send, until, type RawAnswer } from './support/edge-app.js';
import { freePort } from './support/redis-server.js';
import { REDIS_URL } from './support/services.js';

/**
 * `errorFormat: 'problem+json'`: every refusal the guard (and @ContentDigest) answers over HTTP is
 * RFC 9457 problem details under `application/problem+json`, with the message as `detail`;
 * without the option the bodies are Nest's JSON plus `code`, as before. Express and Fastify.
 */
type Format = 'nest' | 'problem+json';

/** Holds /slow's handler until the test opens it. */
let gate: { promise: Promise<void>; open: () => void } | undefined;
const newGate = () => {
  let open = () => undefined as void;
  const promise = new Promise<void>((resolve) => (open = resolve));
  return { promise, open };
};
let slowStarted = 0;

/** Sets `request.user` without an id or sub when asked: the guard cannot tell the user. */
@Injectable()
class ShapelessUser implements CanActivate {
  canActivate(ctx: ExecutionContext): boolean {
    ctx.switchToHttp().getRequest<{ user?: unknown }>().user = { name: 'no id' };
    return true;
  }
}

@Controller()
class RefusalsController {
  @Post('orders')
  @NoRepeatSubmit()
  create(@Body() body: unknown) {
    return { body };
  }

  @Post('slow')
  @NoRepeatSubmit()
  async slow() {
    slowStarted++;
    await gate?.promise;
    return { slow: true };
  }

  @Post('big')
  @NoRepeatSubmit({ maxResponseBytes: 8 })
  big() {
    return { text: 'longer than eight bytes' };
  }

  @Post('users')
  @UseGuards(ShapelessUser)
  @NoRepeatSubmit()
  user() {
    return { user: true };
  }

  @Post('closed')
  @NoRepeatSubmit({ failMode: 'closed' })
  closed() {
    return { closed: true };
  }

  @Post('as-problem')
  @NoRepeatSubmit({ errorFormat: 'problem+json' })
  asProblem() {
    return {};
  }

  @Post('as-nest')
  @NoRepeatSubmit({ errorFormat: 'nest' })
  asNest() {
    return {};
  }

  @Post('digest')
  @ContentDigest()
  digest() {
    return {};
  }

  @Post('digest/required')
  @ContentDigest({ required: true })
  digestRequired() {
    return {};
  }
}

/** An app's catch-everything filter: passes HttpException bodies through, or wraps them when asked. */
@Catch()
class AppFilter implements ExceptionFilter {
  static seen: unknown[] = [];
  constructor(private readonly host: HttpAdapterHost) {}

  catch(exception: unknown, args: ArgumentsHost): void {
    AppFilter.seen.push(exception);
    const { httpAdapter } = this.host;
    const [req, res] = [args.switchToHttp().getRequest(), args.switchToHttp().getResponse()];
    const status = exception instanceof HttpException ? exception.getStatus() : 500;
    const body = exception instanceof HttpException ? exception.getResponse() : { status };
    if ((req as { headers: Record<string, string | undefined> }).headers['x-envelope']) {
      httpAdapter.setHeader(res, 'Content-Type', 'application/json');
      httpAdapter.reply(res, { error: body, path: httpAdapter.getRequestUrl(req) }, status);
      return;
    }
    httpAdapter.reply(res, body, status);
  }
}

async function start(adapter: 'express' | 'fastify', options: IdempotencyModuleOptions, filter = false): Promise<{ app: INestApplication; url: string }> {
  @Module({ imports: [IdempotencyModule.forRoot(options)], controllers: [RefusalsController] })
  class AppModule {}
  const app = await NestFactory.create(AppModule, adapter === 'fastify' ? new FastifyAdapter() : new ExpressAdapter(), {
    logger: ['error'],
    rawBody: true,
  });
  if (filter) app.useGlobalFilters(new AppFilter(app.get(HttpAdapterHost)));
  await app.listen(0, '127.0.0.1');
  return { app, url: `http://127.0.0.1:${(app.getHttpServer().address() as { port: number }).port}` };
}

const deep = (levels: number) => JSON.parse('{"a":'.repeat(levels) + '1' + '}'.repeat(levels)) as unknown;

/** One refusal of each kind, from an app on a working store (`url`) or one whose store is down (`downUrl`). */
const REFUSALS: { kind: string; status: number; code: string; retryAfter?: boolean; answer: (url: string, downUrl: string) => Promise<RawAnswer> }[] = [
  { kind: 'no key', status: 400, code: 'IDEMPOTENCY_KEY_MISSING', answer: (url) => send(url, '/orders', { body: { a: 1 } }) },
  { kind: 'a key over 255 characters', status: 400, code: 'IDEMPOTENCY_KEY_INVALID', answer: (url) => send(url, '/orders', { key: 'k'.repeat(256), body: {} }) },
  {
    kind: 'a payload nested too deep to fingerprint',
    status: 400,
    code: 'IDEMPOTENCY_PAYLOAD_UNSUPPORTED',
    answer: (url) => send(url, '/orders', { key: randomUUID(), body: deep(1100) }),
  },
  {
    kind: 'a duplicate while the first runs',
    status: 409,
    code: 'IDEMPOTENCY_IN_PROGRESS',
    retryAfter: true,
    answer: async (url) => {
      const key = randomUUID();
      gate = newGate();
      const started = slowStarted;
      const first = send(url, '/slow', { key, body: {} });
      await until(() => slowStarted > started);
      const duplicate = await send(url, '/slow', { key, body: {} });
      gate.open();
      expect((await first).status).toBe(201);
      return duplicate;
    },
  },
  {
    kind: 'a duplicate of an answer too large to keep',
    status: 409,
    code: 'IDEMPOTENCY_RESPONSE_NOT_REPLAYABLE',
    answer: async (url) => {
      const key = randomUUID();
      expect((await send(url, '/big', { key, body: {} })).status).toBe(201);
      return send(url, '/big', { key, body: {} });
    },
  },
  {
    kind: 'the key with another payload',
    status: 422,
    code: 'IDEMPOTENCY_KEY_REUSED',
    answer: async (url) => {
      const key = randomUUID();
      expect((await send(url, '/orders', { key, body: { a: 1 } })).status).toBe(201);
      return send(url, '/orders', { key, body: { a: 2 } });
    },
  },
  { kind: 'a user without id or sub', status: 500, code: 'IDEMPOTENCY_USER_UNRESOLVED', answer: (url) => send(url, '/users', { key: randomUUID(), body: {} }) },
  {
    kind: 'the store down on a fail-closed route',
    status: 503,
    code: 'IDEMPOTENCY_STORE_UNAVAILABLE',
    retryAfter: true,
    answer: (_url, downUrl) => send(downUrl, '/closed', { key: randomUUID(), body: {} }),
  },
  {
    kind: '@ContentDigest: a digest that is not one',
    status: 400,
    code: 'CONTENT_HASH_INVALID',
    answer: (url) => send(url, '/digest', { body: { a: 1 }, headers: { 'x-content-hash': 'not-a-digest' } }),
  },
  { kind: '@ContentDigest: no digest where one is required', status: 400, code: 'CONTENT_HASH_MISSING', answer: (url) => send(url, '/digest/required', { body: { a: 1 } }) },
  {
    kind: '@ContentDigest: a Content-Encoding it cannot see through',
    status: 415,
    code: 'CONTENT_HASH_ENCODING_UNSUPPORTED',
    answer: (url) => send(url, '/digest', { headers: { 'content-encoding': 'gzip' } }),
  },
  {
    kind: '@ContentDigest: a digest of other bytes',
    status: 400,
    code: 'CONTENT_HASH_MISMATCH',
    answer: (url) => send(url, '/digest', { body: { a: 1 }, headers: { 'x-content-hash': '0'.repeat(64) } }),
  },
];

const json = (answer: RawAnswer) => JSON.parse(answer.text) as Record<string, unknown>;

function expectProblem(answer: RawAnswer, status: number, code: string): Record<string, unknown> {
  const body = json(answer);
  expect({ status: answer.status, contentType: answer.headers['content-type'] }).toEqual({ status, contentType: expect.stringMatching(/^application\/problem\+json(;|$)/) });
  expect(body).toEqual(
    expect.objectContaining({ type: `tag:nestjs-idempotency,2026:${code}`, title: expect.any(String), status, detail: expect.any(String), code }),
  );
  expect(Object.keys(body).filter((name) => !['type', 'title', 'status', 'detail', 'code'].includes(name))).toEqual(
    code === 'CONTENT_HASH_MISMATCH' ? ['contentHash', 'bytes'] : [],
  );
  return body;
}

function expectNest(answer: RawAnswer, status: number, code: string): Record<string, unknown> {
  const body = json(answer);
  expect({ status: answer.status, contentType: answer.headers['content-type'] }).toEqual({ status, contentType: expect.stringMatching(/^application\/json(;|$)/) });
  expect(body).toEqual(expect.objectContaining({ statusCode: status, error: expect.any(String), message: expect.any(String), code }));
  expect(Object.keys(body).slice(0, 4)).toEqual(['statusCode', 'error', 'message', 'code']);
  expect(Object.keys(body).slice(4)).toEqual(code === 'CONTENT_HASH_MISMATCH' ? ['contentHash', 'bytes'] : []);
  return body;
}

describe.each(['express', 'fastify'] as const)('errorFormat (%s)', (adapter) => {
  const apps = {} as Record<Format, { url: string; downUrl: string; close: () => Promise<void> }>;

  beforeAll(async () => {
    const down = `redis://127.0.0.1:${await freePort()}`;
    for (const format of ['nest', 'problem+json'] as const) {
      // 'nest' is the default: that app does not set the option at all.
      const errorFormat = format === 'nest' ? {} : { errorFormat: format };
      const up = await start(adapter, { store: { redis: REDIS_URL }, keyPrefix: `problem-${randomUUID().slice(0, 8)}`, ...errorFormat });
      const outage = await start(adapter, { store: { redis: down }, ...errorFormat });
      apps[format] = { url: up.url, downUrl: outage.url, close: async () => void (await Promise.all([up.app.close(), outage.app.close()])) };
    }
  });
  afterAll(async () => Promise.all(Object.values(apps).map((app) => app.close())));

  it.each(REFUSALS)('answers $kind with problem details under problem+json, the same words as detail as the default body has as message', async ({ status, code, retryAfter, answer }) => {
    const problem = await answer(apps['problem+json'].url, apps['problem+json'].downUrl);
    const nest = await answer(apps.nest.url, apps.nest.downUrl);
    const { detail } = expectProblem(problem, status, code);
    const { message } = expectNest(nest, status, code);
    expect(detail).toBe(message);
    expect({ problem: problem.headers['retry-after'], nest: nest.headers['retry-after'] }).toEqual(
      retryAfter ? { problem: expect.stringMatching(/^[12]$/), nest: expect.stringMatching(/^[12]$/) } : { problem: undefined, nest: undefined },
    );
  });

  it('keeps the default body exactly as before: Nest JSON plus code, application/json', async () => {
    const answer = await send(apps.nest.url, '/orders', { body: {} });
    expect(answer.headers['content-type']).toMatch(/^application\/json/);
    expect(json(answer)).toEqual({
      statusCode: 400,
      error: 'Bad Request',
      message: 'This operation needs an idempotency key: send one unique value per operation as the Idempotency-Key header and reuse it on retries.',
      code: 'IDEMPOTENCY_KEY_MISSING',
    });
  });

  it('takes a route errorFormat over the module one, either way', async () => {
    for (const format of ['nest', 'problem+json'] as const) {
      expectProblem(await send(apps[format].url, '/as-problem', { body: {} }), 400, 'IDEMPOTENCY_KEY_MISSING');
      expectNest(await send(apps[format].url, '/as-nest', { body: {} }), 400, 'IDEMPOTENCY_KEY_MISSING');
    }
  });

  it('sends the exact problem body for a missing key', async () => {
    expect(json(await send(apps['problem+json'].url, '/orders', { body: {} }))).toEqual({
      type: 'tag:nestjs-idempotency,2026:IDEMPOTENCY_KEY_MISSING',
      title: 'Idempotency key missing',
      status: 400,
      detail: 'This operation needs an idempotency key: send one unique value per operation as the Idempotency-Key header and reuse it on retries.',
      code: 'IDEMPOTENCY_KEY_MISSING',
    });
  });

  describe('under a global exception filter of the app', () => {
    let app: INestApplication;
    let url: string;
    beforeAll(async () => {
      ({ app, url } = await start(adapter, { keyPrefix: `filter-${randomUUID().slice(0, 8)}`, errorFormat: 'problem+json' }, true));
    });
    afterAll(async () => app?.close());

    it('hands the filter the refusal as an IdempotencyHttpException whose getResponse() is the problem body; passed through, it goes out as problem+json', async () => {
      AppFilter.seen = [];
      const answer = await send(url, '/orders', { body: {} });
      expectProblem(answer, 400, 'IDEMPOTENCY_KEY_MISSING');
      const [exception] = AppFilter.seen;
      expect(exception).toBeInstanceOf(IdempotencyHttpException);
      expect((exception as IdempotencyHttpException).getResponse()).toEqual(json(answer));
      expect((exception as IdempotencyHttpException).message).toBe(json(answer).detail);
    });

    it('lets a filter that writes a body of its own shape set its own Content-Type', async () => {
      const answer = await send(url, '/orders', { body: {}, headers: { 'x-envelope': '1' } });
      expect(answer.headers['content-type']).toMatch(/^application\/json/);
      expect(json(answer)).toEqual({ error: expect.objectContaining({ code: 'IDEMPOTENCY_KEY_MISSING', status: 400 }), path: '/orders' });
    });
  });
});
