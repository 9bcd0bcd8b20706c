// The route path in the key of a handler at several paths (guard-edge-route-paths) is worked out
// from the app the route is served by, never from another app in the process, and whatever form
// the versions and wildcards take (an adversarial helper, all double runs):
// - the guard noted in module-level sets which controller classes two modules list and where
//   modules are mounted, for every app in the process: a second app listing a class twice made
//   the first key its route another way (two instances that started their apps in another order
//   ran 10 keys 20 times), and another app mounting a module at 'v1' made a versioned route's
//   path look version-neutral (10 runs for 5 keys);
// - numeric versions (`defaultVersion: [1, 2]`, from JSON or JavaScript) were not stripped;
// - Express's router holds a legacy wildcard (`files/*`) rewritten (`files/{*path}`), which did
//   not match the declared path, so a neutral route lost its own 'v1' segment.
import { afterAll, afterEach, describe, expect, it } from '@jest/globals';
import { Controller, Module, Post, Req, Version, VERSION_NEUTRAL, VersioningType, type INestApplication } from '@nestjs/common';
import { LazyModuleLoader, RouterModule } from '@nestjs/core';
import { randomUUID } from 'node:crypto';
import { MemoryIdempotencyStore, NoRepeatSubmit } from '../libs/idempotency/src/index.js';
import { makeApp, replayed, send, type Adapter, type EdgeApp } from './support/edge-app.js';

const runs: string[] = [];
const ran = (req: { url: string }) => {
  runs.push(req.url);
  return { at: req.url };
};

@Controller('users')
class UsersController {
  @Post()
  @NoRepeatSubmit()
  create(@Req() req: { url: string }) {
    return ran(req);
  }
}
@Module({ controllers: [UsersController] })
class StaffModule {}
@Module({ controllers: [UsersController] })
class SupportModule {}

@Controller('drafts')
class DraftsController {
  @Post(['a', 'b'])
  @Version([VERSION_NEUTRAL, '1'])
  @NoRepeatSubmit()
  write(@Req() req: { url: string }) {
    return ran(req);
  }
}
@Module({ controllers: [DraftsController] })
class DraftsModule {}

@Controller(['orders', 'carts'])
class OrdersController {
  @Post()
  @NoRepeatSubmit()
  create(@Req() req: { url: string }) {
    return ran(req);
  }
}

@Controller('files')
class FilesController {
  @Post(['docs/*', 'pics/*'])
  @Version([VERSION_NEUTRAL, '1'])
  @NoRepeatSubmit()
  upload(@Req() req: { url: string }) {
    return ran(req);
  }
}
@Module({ controllers: [FilesController] })
class FilesModule {}

@Controller('invoices')
class InvoicesController {
  @Post()
  @NoRepeatSubmit()
  create(@Req() req: { url: string }) {
    return ran(req);
  }
}
@Module({ controllers: [InvoicesController] })
class InvoicesModule {}
/** Lists the routed controller again, loaded lazily: Nest routes no controller of a lazy module. */
@Module({ controllers: [InvoicesController] })
class InvoiceReportsModule {}

const open: EdgeApp[] = [];
const app = async (...args: Parameters<typeof makeApp>) => {
  const made = await makeApp(...args);
  open.push(made);
  return made;
};
const uriVersions = (defaultVersion?: unknown) => (nest: INestApplication) =>
  void nest.enableVersioning({ type: VersioningType.URI, ...(defaultVersion === undefined ? {} : { defaultVersion: defaultVersion as string }) });

describe.each<Adapter>(['express', 'fastify'])('the route path in a key, per app (%s)', (adapter) => {
  afterEach(async () => {
    await Promise.all(open.splice(0).map((made) => made.close()));
  });
  afterAll(async () => {
    await Promise.all(open.splice(0).map((made) => made.close()));
  });

  it('is the same on two instances of one app, whatever another app in the process lists', async () => {
    const store = new MemoryIdempotencyStore();
    const first = await app(adapter, [UsersController], { store });
    const key = randomUUID();
    const before = runs.length;
    const answer = await send(first.url, '/users', { key });
    // Another app of the process lists the class in two modules, mounted at two paths.
    await app(adapter, [], { store: new MemoryIdempotencyStore() }, {
      imports: [{ module: StaffModule }, { module: SupportModule }, RouterModule.register([{ path: 'staff', module: StaffModule }, { path: 'support', module: SupportModule }])],
    });
    const second = await app(adapter, [UsersController], { store });
    const retry = await send(second.url, '/users', { key });
    // Observed before: the retry ran again (keyed `UsersController.create#/users` on the second).
    expect([answer.status, retry.status, replayed(retry), retry.text]).toEqual([201, 201, true, answer.text]);
    expect(runs.length - before).toBe(1);
  });

  it('strips the version segment of a versioned route though another app mounts its module at v1', async () => {
    await app(adapter, [], { store: new MemoryIdempotencyStore() }, {
      imports: [{ module: DraftsModule }, RouterModule.register([{ path: 'v1', module: DraftsModule }])],
      setup: uriVersions(),
    });
    const main = await app(adapter, [], { store: new MemoryIdempotencyStore() }, { imports: [{ module: DraftsModule }], setup: uriVersions() });
    const key = randomUUID();
    const before = runs.length;
    const neutral = await send(main.url, '/drafts/a', { key });
    const versioned = await send(main.url, '/v1/drafts/a', { key });
    expect([neutral.status, versioned.status, replayed(versioned)]).toEqual([201, 201, true]);
    expect(runs.length - before).toBe(1);
  });

  it('strips numeric versions as Nest serves them (defaultVersion: [1, 2])', async () => {
    const main = await app(adapter, [OrdersController], {}, { setup: uriVersions([1, 2]) });
    const key = randomUUID();
    const before = runs.length;
    const first = await send(main.url, '/v1/orders', { key });
    const retry = await send(main.url, '/v2/orders', { key });
    const other = await send(main.url, '/v2/carts', { key });
    expect([first.status, retry.status, replayed(retry), other.status, replayed(other)]).toEqual([201, 201, true, 201, false]);
    expect(runs.slice(before)).toEqual(['/v1/orders', '/v2/carts']);
  });

  it('knows a neutral route by its wildcard as the router holds it', async () => {
    const main = await app(adapter, [], {}, {
      imports: [{ module: FilesModule }, RouterModule.register([{ path: 'v1', module: FilesModule }])],
      setup: uriVersions(),
    });
    const key = randomUUID();
    const before = runs.length;
    const neutral = await send(main.url, '/v1/files/docs/x', { key });
    const versioned = await send(main.url, '/v1/v1/files/docs/x', { key });
    const other = await send(main.url, '/v1/files/pics/x', { key });
    expect([neutral.status, versioned.status, replayed(versioned), other.status, replayed(other)]).toEqual([201, 201, true, 201, false]);
    expect(runs.length - before).toBe(2);
  });

  // An adversarial helper: a lazily loaded module listing an already routed controller counted as
  // a second mount, so the route's key changed once it was loaded (20 runs for 10 keys).
  it('keys a route alike before and after a lazy module that lists its controller is loaded', async () => {
    const store = new MemoryIdempotencyStore();
    const first = await app(adapter, [], { store }, { imports: [{ module: InvoicesModule }] });
    const second = await app(adapter, [], { store }, { imports: [{ module: InvoicesModule }] });
    await second.app.get(LazyModuleLoader).load(() => InvoiceReportsModule);
    const before = runs.length;
    for (let i = 0; i < 3; i++) {
      const key = randomUUID();
      const answer = await send(first.url, '/invoices', { key });
      const retry = await send(second.url, '/invoices', { key });
      expect([answer.status, retry.status, replayed(retry)]).toEqual([201, 201, true]);
    }
    expect(runs.length - before).toBe(3);
  });
});
