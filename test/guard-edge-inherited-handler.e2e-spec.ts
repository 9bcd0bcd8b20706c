// A generic CRUD base controller (`create` defined once on the base) and two guarded subclasses
// routed at /users and /orders. Nest calls the SAME function object for both routes, and the
// guard once cached each route's settings (its `Controller.method` key segment) by that function
// only: whichever subclass was called first named the key for both, so a client key used on
// /users was replayed on /orders (the orders handler never ran). And when only ONE subclass was
// guarded, the unguarded sibling either turned the guard off for the guarded one (called first)
// or was guarded under the other's name (called second). Routes are now resolved per class.
import { afterAll, beforeAll, describe, expect, it } from '@jest/globals';
import { Body, ConflictException, Controller, HttpCode, Module, Post, Scope, type Type } from '@nestjs/common';
import { NestFactory } from '@nestjs/core';
import { ClientProxyFactory, EventPattern, Payload, Transport } from '@nestjs/microservices';
import { ExpressAdapter } from '@nestjs/platform-express';
import { DocumentBuilder, SwaggerModule } from '@nestjs/swagger';
import { FastifyAdapter } from '@nestjs/platform-fastify';
import { randomUUID } from 'node:crypto';
import { firstValueFrom } from 'rxjs';
import { IdempotencyModule, NoRepeatSubmit } from '../libs/idempotency/src/index.js';
import { makeApp, replayed, send, sleep, until, type Adapter, type EdgeApp } from './support/edge-app.js';
import { REDIS_URL } from './support/services.js';

const runs: string[] = [];

abstract class CrudController {
  protected abstract readonly kind: string;
  @Post()
  @HttpCode(200)
  create(@Body() body: { name: string }) {
    runs.push(`${this.kind} ${body.name}`);
    return { kind: this.kind, name: body.name };
  }
}

@Controller('users')
@NoRepeatSubmit()
class UsersController extends CrudController {
  protected readonly kind = 'user';
}

@Controller('orders')
@NoRepeatSubmit()
class OrdersController extends CrudController {
  protected readonly kind = 'order';
}

// One guarded subclass and one unguarded one of another base.
abstract class AuditBase {
  protected abstract readonly kind: string;
  @Post()
  @HttpCode(200)
  record(@Body() body: { name: string }) {
    runs.push(`${this.kind} ${body.name}`);
    return { kind: this.kind, name: body.name };
  }
}

@Controller('guarded-audit')
@NoRepeatSubmit()
class GuardedAudit extends AuditBase {
  protected readonly kind = 'guarded';
}

@Controller('plain-audit')
class PlainAudit extends AuditBase {
  protected readonly kind = 'plain';
}

// A base message handler, one guarded subclass and one unguarded.
abstract class EventsBase {
  @EventPattern('inherited.audit')
  record(@Payload() data: { id: string }) {
    runs.push(`event ${data.id}`);
  }
}

@Controller()
@NoRepeatSubmit({ idempotentKey: '#data.id' })
class GuardedEvents extends EventsBase {}

@Controller()
class PlainEvents extends EventsBase {}

describe.each<Adapter>(['express', 'fastify'])('guarded subclasses sharing a base method (%s)', (adapter) => {
  let app: EdgeApp;
  beforeAll(async () => {
    app = await makeApp(adapter, [UsersController, OrdersController, PlainAudit, GuardedAudit, GuardedEvents]);
  });
  afterAll(() => app.close());

  it('keeps /users and /orders apart: the same client key on the other route runs that route', async () => {
    const key = randomUUID();
    const user = await send(app.url, '/users', { key, body: { name: 'x' } });
    const order = await send(app.url, '/orders', { key, body: { name: 'x' } });
    expect(JSON.parse(user.text)).toEqual({ kind: 'user', name: 'x' });
    // Observed: 200 { kind: 'user' } with Idempotent-Replayed: true; the orders handler never ran.
    expect({ replayed: replayed(order), body: JSON.parse(order.text) }).toEqual({
      replayed: false,
      body: { kind: 'order', name: 'x' },
    });
  });

  it('guards the guarded subclass even when its unguarded sibling was called first', async () => {
    // the unguarded sibling first: it caches "no guard" for the shared function
    await send(app.url, '/plain-audit', { body: { name: 'p' } });
    const key = randomUUID();
    const before = runs.length;
    const first = await send(app.url, '/guarded-audit', { key, body: { name: 'g' } });
    const second = await send(app.url, '/guarded-audit', { key, body: { name: 'g' } });
    expect(first.status).toBe(200);
    // Observed: both ran (no replay): the guard is off on /guarded-audit.
    expect({ runs: runs.length - before, replayed: replayed(second) }).toEqual({ runs: 1, replayed: true });
  });

  it('leaves the base method unguarded for a later app that holds only the unguarded siblings, without IdempotencyModule', async () => {
    // A test module of the same process: the guard was put on the base's method function itself,
    // and this app refused to start (`does not see IdempotencyModule`): helper-191.
    @Module({ controllers: [PlainAudit, PlainEvents] })
    class PlainModule {}
    const plain =
      adapter === 'fastify'
        ? await NestFactory.create(PlainModule, new FastifyAdapter(), { logger: false, abortOnError: false })
        : await NestFactory.create(PlainModule, new ExpressAdapter(), { logger: false, abortOnError: false });
    try {
      await plain.listen(0, '127.0.0.1');
      const url = `http://127.0.0.1:${(plain.getHttpServer().address() as { port: number }).port}`;
      const key = randomUUID();
      const answers = [await send(url, '/plain-audit', { key, body: { name: 'q' } }), await send(url, '/plain-audit', { key, body: { name: 'q' } })];
      expect(answers.map((a) => [a.status, replayed(a)])).toEqual([
        [200, false],
        [200, false],
      ]);
    } finally {
      await plain.close();
    }
  });
});

describe('a guarded subclass of a base message handler', () => {
  it('runs each event id once: the subclass takes the guard on a method of its own', async () => {
    const { hostname, port } = new URL(REDIS_URL);
    const transport = { transport: Transport.REDIS, options: { host: hostname, port: Number(port || 6379) } } as const;
    @Module({ imports: [IdempotencyModule.forRoot({ store: { redis: REDIS_URL }, keyPrefix: `inherited-${randomUUID().slice(0, 8)}` })], controllers: [GuardedEvents] })
    class EventsModule {}
    const server = await NestFactory.createMicroservice(EventsModule, { ...transport, logger: false });
    await server.listen();
    const client = ClientProxyFactory.create(transport);
    try {
      await client.connect();
      const id = randomUUID();
      await Promise.all([1, 2, 3].map(() => firstValueFrom(client.emit('inherited.audit', { id }))));
      await until(() => runs.includes(`event ${id}`), 3000, 'the event to run');
      await sleep(300);
      expect(runs.filter((run) => run === `event ${id}`)).toHaveLength(1);
    } finally {
      await client.close();
      await server.close();
    }
  });
});

// A guarded controller whose subclass is a guarded controller too, saving its 409s: each route
// takes its own start mark, whichever class is placed first.
function guardedPair(path: string): [Type, Type] {
  @Controller(`${path}-base`)
  @NoRepeatSubmit({ saveStatuses: [409] })
  class GuardedBase {
    @Post()
    create(@Body() body: { name: string }) {
      runs.push(`${path} ${body.name} ${arguments.length}`);
      throw new ConflictException({ code: 'EXISTS', name: body.name });
    }
  }
  @Controller(`${path}-sub`)
  class GuardedSub extends GuardedBase {}
  return [GuardedBase, GuardedSub];
}

describe.each<Adapter>(['express', 'fastify'])('a guarded controller and its guarded subclass, saving 409s (%s)', (adapter) => {
  const [baseFirst, subAfter] = guardedPair(`${adapter}-bf`);
  const [baseAfter, subFirst] = guardedPair(`${adapter}-sf`);
  const apps: Record<string, EdgeApp> = {};
  beforeAll(async () => {
    // Two apps: the class names of a pair are the same.
    apps.bf = await makeApp(adapter, [baseFirst, subAfter], { store: { redis: REDIS_URL }, keyPrefix: `inh-${randomUUID()}` });
    apps.sf = await makeApp(adapter, [subFirst, baseAfter], { store: { redis: REDIS_URL }, keyPrefix: `inh-${randomUUID()}` });
  });
  afterAll(async () => {
    await apps.bf?.close();
    await apps.sf?.close();
  });

  it.each(['bf-base', 'bf-sub', 'sf-base', 'sf-sub'])('/%s runs once, its 409 replayed, the method given its own arguments', async (route) => {
    const app = apps[route.slice(0, 2)]!;
    const key = randomUUID();
    const name = randomUUID();
    const answers = await Promise.all([1, 2, 3, 4, 5].map(() => send(app.url, `/${adapter}-${route}`, { key, body: { name } })));
    expect(answers.map((a) => a.status)).toEqual([409, 409, 409, 409, 409]);
    const later = await send(app.url, `/${adapter}-${route}`, { key, body: { name } });
    expect([later.status, replayed(later), JSON.parse(later.text).name]).toEqual([409, true, name]);
    expect(runs.filter((run) => run.includes(` ${name} `))).toEqual([`${adapter}-${route.slice(0, 2)} ${name} 1`]);
  });
});

// OpenAPI: a route a guarded controller inherits is documented as guarded (helper-197: after the
// subclass got a method of its own, the documentation went on the base's method only: a method
// decorated on its base class, and a controller under a guarded controller, showed no key header
// and none of the guard's answers).
/** Made per test: declared at import, the classes were documented by an earlier app before any placement. */
function docsControllers(): Type[] {
  abstract class PaymentsBase {
    @Post()
    @NoRepeatSubmit()
    pay(@Body() body: { amount: number }) {
      return { paid: body.amount };
    }
  }
  @Controller('docs-pay')
  class DocsPay extends PaymentsBase {}

  abstract class ActionsBase {
    @Post()
    act(@Body() body: { name: string }) {
      return { acted: body.name };
    }
  }
  @Controller('docs-mid')
  @NoRepeatSubmit()
  class DocsMid extends ActionsBase {}
  @Controller('docs-leaf')
  class DocsLeaf extends DocsMid {}
  return [DocsPay, DocsMid, DocsLeaf];
}

describe.each<Adapter>(['express', 'fastify'])('OpenAPI of inherited guarded routes (%s)', (adapter) => {
  it.each(['/docs-pay', '/docs-mid', '/docs-leaf'])('documents %s with the key header and the guard\'s answers', async (path) => {
    const app = await makeApp(adapter, docsControllers());
    try {
      const document = SwaggerModule.createDocument(app.app, new DocumentBuilder().build());
      const operation = document.paths[path]!.post!;
      expect({
        header: (operation.parameters ?? []).some((parameter) => 'name' in parameter && parameter.name === 'Idempotency-Key'),
        statuses: Object.keys(operation.responses).sort(),
      }).toEqual({ header: true, statuses: ['201', '400', '409', '422', '500', '503'] });
    } finally {
      await app.close();
    }
  });
});

// helper-197: a request-scoped guarded subclass (no saved statuses: no start mark of its own) read
// the start mark a later app put on its guarded base controller (saving 409s): Nest builds a
// request-scoped route's parameters at its first request, and the subclass's method got the
// request as a third argument.
function markedPair(): [Type, Type] {
  @Controller('marked-base')
  @NoRepeatSubmit({ saveStatuses: [409] })
  class MarkedBase {
    @Post()
    create(@Body() body: { name: string }) {
      return { name: body.name, args: arguments.length };
    }
  }
  @Controller({ path: 'scoped-leaf', scope: Scope.REQUEST })
  @NoRepeatSubmit({ saveStatuses: [] })
  class ScopedLeaf extends MarkedBase {}
  return [MarkedBase, ScopedLeaf];
}

describe.each<Adapter>(['express', 'fastify'])('a request-scoped guarded subclass of a base a later app marks (%s)', (adapter) => {
  it('gets its own arguments only', async () => {
    const [MarkedBase, ScopedLeaf] = markedPair();
    const leafApp = await makeApp(adapter, [ScopedLeaf]);
    const baseApp = await makeApp(adapter, [MarkedBase]);
    try {
      const leaf = await send(leafApp.url, '/scoped-leaf', { key: randomUUID(), body: { name: 'l' } });
      const base = await send(baseApp.url, '/marked-base', { key: randomUUID(), body: { name: 'b' } });
      // Observed before: { name: 'l', args: 2 } on /scoped-leaf.
      expect([JSON.parse(leaf.text), JSON.parse(base.text)]).toEqual([
        { name: 'l', args: 1 },
        { name: 'b', args: 1 },
      ]);
    } finally {
      await leafApp.close();
      await baseApp.close();
    }
  });
});
