// One handler that answers at several paths. A method on two paths (`@Post([':id/like',
// ':id/unlike'])`) was keyed `Controller.method` with neither path in its key nor its
// fingerprint: the unlike got the like's saved answer, and the reject the approve's (an
// adversarial helper). So did one controller class that two modules mount (`RouterModule`:
// `/admin/users` and `/public/users`). The path the router matched now joins the key's handler
// segment of such handlers; a handler at one path keeps `Controller.method`.
import { afterAll, beforeAll, describe, expect, it } from '@jest/globals';
import { Body, Controller, Module, Param, Post, Req, Version, VERSION_NEUTRAL, VersioningType } from '@nestjs/common';
import { RouterModule } from '@nestjs/core';
import { randomUUID } from 'node:crypto';
import { NoRepeatSubmit } from '../libs/idempotency/src/index.js';
import { makeApp, replayed, send, type Adapter, type EdgeApp } from './support/edge-app.js';

const runs: string[] = [];

@Controller('posts')
class PostsController {
  @Post([':id/approve', ':id/reject'])
  @NoRepeatSubmit({ idempotentKey: '#params.id' })
  decide(@Param('id') id: string, @Req() req: { url: string }) {
    const op = req.url.endsWith('approve') ? 'approve' : 'reject';
    runs.push(`${op} ${id}`);
    return { op, id };
  }

  @Post(':id/archive')
  @NoRepeatSubmit({ idempotentKey: '#params.id' })
  archive(@Param('id') id: string) {
    runs.push(`archive ${id}`);
    return { op: 'archive', id };
  }
}

@Controller('users')
class UsersController {
  @Post()
  @NoRepeatSubmit()
  create(@Body() body: { name: string }, @Req() req: { url: string }) {
    runs.push(`${req.url} ${body.name}`);
    return { at: req.url, name: body.name };
  }
}

@Controller(['staff/members', 'guest/members'])
class MembersController {
  @Post()
  @NoRepeatSubmit()
  create(@Body() body: { name: string }, @Req() req: { url: string }) {
    runs.push(`${req.url} ${body.name}`);
    return { at: req.url, name: body.name };
  }
}

/** One handler at two paths, each under two API versions. */
@Controller('orders')
class VersionedOrdersController {
  @Post([':id/approve', ':id/confirm'])
  @Version(['1', '2'])
  @NoRepeatSubmit({ idempotentKey: '#params.id' })
  decide(@Param('id') id: string, @Req() req: { url: string }) {
    runs.push(`versioned ${req.url}`);
    return { id, at: req.url };
  }
}

/** Version-neutral, at two paths the first of which starts as a version segment would. */
@Controller({ version: VERSION_NEUTRAL })
class NeutralNotesController {
  @Post(['v1/notes/:id', 'notes/:id'])
  @NoRepeatSubmit({ idempotentKey: '#params.id' })
  write(@Param('id') id: string, @Req() req: { url: string }) {
    runs.push(`neutral ${req.url}`);
    return { id, at: req.url };
  }
}

/**
 * Version-neutral and version 1 at once (as `defaultVersion: [VERSION_NEUTRAL, '1']` makes every
 * route), at two paths the first of which starts as a version segment would: its neutral route
 * `/api/v1/drafts/:id` and its version-1 route `/api/v1/v1/drafts/:id` are one operation.
 */
function mixedNotes(name: string, path = '') {
  @Controller(path)
  class MixedNotesController {
    @Post(['v1/drafts/:id', 'memos/:id'])
    @Version([VERSION_NEUTRAL, '1'])
    @NoRepeatSubmit({ idempotentKey: '#params.id' })
    write(@Param('id') id: string, @Req() req: { url: string }) {
      runs.push(`mixed ${req.url}`);
      return { id, at: req.url };
    }
  }
  Object.defineProperty(MixedNotesController, 'name', { value: name });
  return MixedNotesController;
}
const MixedNotesController = mixedNotes('MixedNotesController');
const TeamNotesController = mixedNotes('TeamNotesController', 'team');
@Module({ controllers: [TeamNotesController] })
class TeamModule {}

@Module({ controllers: [UsersController] })
class AdminModule {}
@Module({ controllers: [UsersController] })
class PublicModule {}

describe.each<Adapter>(['express', 'fastify'])('one handler at several paths (%s)', (adapter) => {
  let a: EdgeApp;
  beforeAll(async () => {
    a = await makeApp(adapter, [PostsController, MembersController], {}, {
      imports: [
        { module: AdminModule },
        { module: PublicModule },
        RouterModule.register([
          { path: 'admin', module: AdminModule },
          { path: 'public', module: PublicModule },
        ]),
      ],
    });
  });
  afterAll(async () => a?.close());

  it('a method on two paths runs each: the reject never gets the approve\'s answer', async () => {
    runs.length = 0;
    const id = randomUUID();
    await send(a.url, `/posts/${id}/approve`);
    const reject = await send(a.url, `/posts/${id}/reject`);
    const rejectAgain = await send(a.url, `/posts/${id}/reject`);
    expect({ reject: [reject.status, replayed(reject), JSON.parse(reject.text).op], again: [replayed(rejectAgain), JSON.parse(rejectAgain.text).op], runs }).toEqual({
      reject: [201, false, 'reject'],
      again: [true, 'reject'],
      runs: [`approve ${id}`, `reject ${id}`],
    });
  });

  it('a controller two modules mount runs at each path: /public/users never gets /admin/users\' answer', async () => {
    runs.length = 0;
    const key = randomUUID();
    await send(a.url, '/admin/users', { key, body: { name: 'ann' } });
    const open = await send(a.url, '/public/users', { key, body: { name: 'ann' } });
    expect({ status: open.status, replayed: replayed(open), at: JSON.parse(open.text).at, runs }).toEqual({
      status: 201,
      replayed: false,
      at: '/public/users',
      runs: ['/admin/users ann', '/public/users ann'],
    });
  });

  it('a controller on two paths runs at each: /guest/members never gets /staff/members\' answer', async () => {
    runs.length = 0;
    const key = randomUUID();
    await send(a.url, '/staff/members', { key, body: { name: 'ann' } });
    const guest = await send(a.url, '/guest/members', { key, body: { name: 'ann' } });
    expect({ status: guest.status, replayed: replayed(guest), runs }).toEqual({
      status: 201,
      replayed: false,
      runs: ['/staff/members ann', '/guest/members ann'],
    });
  });

  it('(control) a handler at one path keeps one record per key', async () => {
    runs.length = 0;
    const id = randomUUID();
    await send(a.url, `/posts/${id}/archive`);
    const again = await send(a.url, `/posts/${id}/archive`);
    expect({ replayed: replayed(again), runs }).toEqual({ replayed: true, runs: [`archive ${id}`] });
  });
});

// An adversarial helper: the matched path carried the global prefix and the URI version, so a
// handler at several paths serving two versions ran again for a retry under the other version
// (20 of 20 keys), where a handler at one path replays it (the README: one route). Its key now
// leaves both out; its own paths still tell its operations apart.
describe.each<Adapter>(['express', 'fastify'])('a handler at several paths under a global prefix and URI versions (%s)', (adapter) => {
  let a: EdgeApp;
  beforeAll(async () => {
    a = await makeApp(adapter, [VersionedOrdersController, NeutralNotesController, MixedNotesController], {}, {
      imports: [{ module: TeamModule }, RouterModule.register([{ path: 'v1', module: TeamModule }])],
      setup: (app) => {
        app.setGlobalPrefix('api');
        app.enableVersioning({ type: VersioningType.URI, defaultVersion: '1' });
      },
    });
  });
  afterAll(async () => a?.close());

  it('replays a retry under the other version, and runs the other path', async () => {
    const id = randomUUID();
    const before = runs.length;
    const first = await send(a.url, `/api/v1/orders/${id}/approve`, {});
    const again = await send(a.url, `/api/v2/orders/${id}/approve`, {});
    expect([first.status, again.status, replayed(again), again.text]).toEqual([201, 201, true, first.text]);
    const other = await send(a.url, `/api/v2/orders/${id}/confirm`, {});
    expect([other.status, replayed(other)]).toEqual([201, false]);
    expect(runs.slice(before)).toEqual([`versioned /api/v1/orders/${id}/approve`, `versioned /api/v2/orders/${id}/confirm`]);
  });

  // A version-neutral route has no version segment: its own `v1/...` stays in its key.
  it('keeps apart the paths of a version-neutral handler whose own first segment looks like a version', async () => {
    const id = randomUUID();
    const before = runs.length;
    const first = await send(a.url, `/api/v1/notes/${id}`, {});
    const other = await send(a.url, `/api/notes/${id}`, {});
    expect([first.status, other.status, replayed(other)]).toEqual([201, 201, false]);
    expect(runs.slice(before)).toEqual([`neutral /api/v1/notes/${id}`, `neutral /api/notes/${id}`]);
  });

  // An adversarial helper: keyed `/v1/drafts/:id` on its neutral route and `/v1/v1/drafts/:id`
  // on its version-1 route, a retry under the other version ran again (20 runs for 10 keys).
  it.each([
    ['at the root', ''],
    // Mounted at 'v1' by RouterModule: its neutral routes start as a version segment would.
    ['mounted by RouterModule at v1', '/v1/team'],
  ])('replays a retry under the other version of a handler both version-neutral and versioned (%s)', async (_name, mount) => {
    const id = randomUUID();
    const before = runs.length;
    const neutral = await send(a.url, `/api${mount}/v1/drafts/${id}`, {});
    const versioned = await send(a.url, `/api/v1${mount}/v1/drafts/${id}`, {});
    expect([neutral.status, versioned.status, replayed(versioned), versioned.text]).toEqual([201, 201, true, neutral.text]);
    const memo = await send(a.url, `/api/v1${mount}/memos/${id}`, {});
    const memoNeutral = await send(a.url, `/api${mount}/memos/${id}`, {});
    expect([memo.status, replayed(memo), memoNeutral.status, replayed(memoNeutral)]).toEqual([201, false, 201, true]);
    expect(runs.slice(before)).toEqual([`mixed /api${mount}/v1/drafts/${id}`, `mixed /api/v1${mount}/memos/${id}`]);
  });
});
