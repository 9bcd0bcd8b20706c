// Which routes a class-level or method-level decorator guards, found by an adversarial review of
// the Nest conventions: @All() routes, HEAD requests to guarded GETs, a skipped base class under an
// explicitly guarded subclass, ignoreFields of a controller and its method, a throwing skipIf, and
// OpenAPI for inherited and optional-key routes.
import { afterAll, beforeAll, describe, expect, it } from '@jest/globals';
import { All, Body, Controller, Get, Post } from '@nestjs/common';
import { DocumentBuilder, SwaggerModule } from '@nestjs/swagger';
import { randomUUID } from 'node:crypto';
import { NoRepeatSubmit, SkipIdempotency } from '../libs/idempotency/src/index.js';
import { codeOf, makeApp, replayed, send, type Adapter, type EdgeApp } from './support/edge-app.js';

const runs: Record<string, number> = {};
const run = (name: string) => ({ name, run: (runs[name] = (runs[name] ?? 0) + 1) });

// 1. @All() under a class-level decorator
@Controller('a3all')
@NoRepeatSubmit()
class AllController {
  @All('any')
  any() {
    return run('all');
  }
}

// 2. @SkipIdempotency() on a base class silently disables a subclass's explicit decorators
@SkipIdempotency()
class SkippedBase {
  @Post('base')
  base() {
    return run('skipBase');
  }
}
@Controller('a3sub')
@NoRepeatSubmit()
class GuardedSub extends SkippedBase {
  @Post('own')
  @NoRepeatSubmit({ expireSeconds: 60 })
  own() {
    return run('subOwn');
  }
}

// 3. ignoreFields: class's dropped by a method's
@Controller('a3merge')
@NoRepeatSubmit({ ignoreFields: ['ts'] })
class MergeController {
  @Post('plain')
  plain(@Body() _b: unknown) {
    return run('plain');
  }
  @Post('more')
  @NoRepeatSubmit({ ignoreFields: ['nonce'] })
  more(@Body() _b: unknown) {
    return run('more');
  }
}

// 4. skipIf throwing
@Controller('a3skip')
class SkipIfController {
  @Post()
  @NoRepeatSubmit({
    skipIf: () => {
      throw new Error('secret internal detail');
    },
  })
  create() {
    return run('skipThrows');
  }
}

// 5. HEAD on a guarded GET
@Controller('a3get')
@NoRepeatSubmit({ methods: ['GET'] })
class GetController {
  @Get()
  read() {
    return run('get');
  }
}

// 6. OpenAPI: inherited routes of a guarded subclass; required:false documented as required
class CrudBase {
  @Post('create')
  create() {
    return run('crudCreate');
  }
}
@Controller('a3crud')
@NoRepeatSubmit()
class CrudController extends CrudBase {}

@Controller('a3opt')
class OptionalController {
  @Post()
  @NoRepeatSubmit({ required: false })
  create() {
    return run('opt');
  }
}

const controllers = [AllController, GuardedSub, MergeController, SkipIfController, GetController, CrudController, OptionalController];

describe.each<Adapter>(['express', 'fastify'])('which routes the guard guards, and with what options (%s)', (adapter) => {
  let edge: EdgeApp;
  beforeAll(async () => {
    edge = await makeApp(adapter, controllers, { keyPrefix: `a3${adapter}`, getUser: () => 'u1' });
  });
  afterAll(async () => edge.close());

  it('guards a POST that reaches an @All() route of a guarded controller (runs it once)', async () => {
    const key = randomUUID();
    runs.all = 0;
    const first = await send(edge.url, '/a3all/any', { key });
    const second = await send(edge.url, '/a3all/any', { key });
    expect([first.status, second.status]).toEqual([200, 200]);
    expect(replayed(second)).toBe(true);
    expect(runs.all).toBe(1);
  });

  it("keeps a subclass's explicit @NoRepeatSubmit when its base class is @SkipIdempotency()", async () => {
    const key = randomUUID();
    runs.subOwn = 0;
    await send(edge.url, '/a3sub/own', { key });
    const second = await send(edge.url, '/a3sub/own', { key });
    expect(replayed(second)).toBe(true);
    expect(runs.subOwn).toBe(1);
  });

  it("keeps the controller's ignoreFields when a method adds its own", async () => {
    const key = randomUUID();
    const first = await send(edge.url, '/a3merge/more', { key, body: { a: 1, ts: 1, nonce: 1 } });
    const second = await send(edge.url, '/a3merge/more', { key, body: { a: 1, ts: 2, nonce: 2 } });
    expect(first.status).toBe(201);
    expect([second.status, codeOf(second)]).toEqual([201, undefined]);
    expect(replayed(second)).toBe(true);
  });

  it('answers a throwing skipIf without leaking its message, never running the handler', async () => {
    runs.skipThrows = 0;
    const answer = await send(edge.url, '/a3skip', { key: randomUUID() });
    expect(answer.status).toBe(500);
    expect(answer.text).not.toContain('secret internal detail');
    expect(runs.skipThrows).toBe(0);
  });

  it('does not let a HEAD (routed to a guarded GET) burn the key of the GET that follows', async () => {
    const key = randomUUID();
    runs.get = 0;
    const head = await send(edge.url, '/a3get', { key, method: 'HEAD' });
    const get = await send(edge.url, '/a3get', { key, method: 'GET' });
    expect(head.status).toBe(200);
    // The HEAD ran the handler under the guard and took the key: the real GET is refused 422.
    expect([get.status, codeOf(get)]).toEqual([200, undefined]);
  });

});

describe('OpenAPI of the routes the guard guards (express)', () => {
  let edge: EdgeApp;
  let doc: ReturnType<typeof SwaggerModule.createDocument>;
  beforeAll(async () => {
    edge = await makeApp('express', controllers, { keyPrefix: 'a3doc', getUser: () => 'u1' });
    doc = SwaggerModule.createDocument(edge.app, new DocumentBuilder().build());
  });
  afterAll(async () => edge.close());

  it('documents the guard on an inherited route that the guard guards', async () => {
    const key = randomUUID();
    runs.crudCreate = 0;
    await send(edge.url, '/a3crud/create', { key });
    const again = await send(edge.url, '/a3crud/create', { key });
    expect(replayed(again)).toBe(true); // guarded at runtime
    const responses = doc.paths['/a3crud/create']!.post!.responses as Record<string, unknown>;
    expect(Object.keys(responses)).toEqual(expect.arrayContaining(['400', '409', '422']));
  });

  it('documents the key header of a required: false route as optional', async () => {
    const missing = await send(edge.url, '/a3opt');
    expect(missing.status).toBe(201); // runs without a key
    const params = (doc.paths['/a3opt']!.post!.parameters ?? []) as { name: string; required?: boolean }[];
    const header = params.find((p) => p.name === 'Idempotency-Key');
    expect(header?.required).toBe(false);
  });
});
