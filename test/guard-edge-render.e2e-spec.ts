// A guarded @Render() route (a view engine: Express's own, Fastify's @fastify/view with Eta). Its
// first answer is the rendered page; a replay must send that page without giving it to the view
// engine as the template's data: on Express every replay threw inside the app (res.render with a
// string: "Cannot create property '_locals' on string"), which the app's exception filter and
// Nest's log saw, though the client got the right bytes (found by an adversarial helper); on
// Fastify the engine rendered the template again from the page, which fails as soon as the
// template reads a nested field.
import { afterAll, beforeAll, describe, expect, it } from '@jest/globals';
import { ArgumentsHost, Body, Catch, Controller, Post, Render, type INestApplication } from '@nestjs/common';
import { BaseExceptionFilter } from '@nestjs/core';
import type { NestExpressApplication } from '@nestjs/platform-express';
import type { NestFastifyApplication } from '@nestjs/platform-fastify';
import { Eta } from 'eta';
import { randomUUID } from 'node:crypto';
import { mkdtempSync, rmSync, writeFileSync } from 'node:fs';
import { tmpdir } from 'node:os';
import { basename, join } from 'node:path';
import { NoRepeatSubmit } from '../libs/idempotency/src/index.js';
import { makeApp, raw, replayed, type Adapter, type EdgeApp } from './support/edge-app.js';

let runs = 0;
const caught: unknown[] = [];

@Controller()
class PagesController {
  @Post('page')
  @Render('page.eta')
  @NoRepeatSubmit()
  page(@Body() body: { name: string }) {
    return { user: { name: body.name }, n: ++runs };
  }
}

/** The app's catch-all filter: records what reaches it, then answers as Nest would. */
@Catch()
class SeenFilter extends BaseExceptionFilter {
  override catch(exception: unknown, host: ArgumentsHost) {
    caught.push(exception);
    super.catch(exception, host);
  }
}

describe.each<Adapter>(['express', 'fastify'])('a guarded @Render() route (%s)', (adapter) => {
  let edge: EdgeApp;
  const views = mkdtempSync(join(tmpdir(), 'idempotency-views-'));
  beforeAll(async () => {
    writeFileSync(join(views, 'page.eta'), '<h1>Hello <%= it.user.name %> #<%= it.n %></h1>');
    const eta = new Eta({ views });
    edge = await makeApp(adapter, [PagesController], { keyPrefix: `render-${randomUUID()}` }, {
      setup: (app: INestApplication) => {
        app.useGlobalFilters(new SeenFilter(app.getHttpAdapter()));
        if (adapter === 'fastify') {
          (app as NestFastifyApplication).setViewEngine({ engine: { eta }, templates: views });
        } else {
          const express = app as NestExpressApplication;
          express.engine('eta', (file: string, data: object, done: (error: unknown, html?: string) => void) => {
            try {
              done(null, eta.render(basename(file), data));
            } catch (error) {
              done(error);
            }
          });
          express.setBaseViewsDir(views);
          express.setViewEngine('eta');
        }
      },
    });
  });
  afterAll(async () => {
    await edge?.close();
    rmSync(views, { recursive: true, force: true });
  });

  it('replays the rendered page byte for byte, and nothing in the app fails', async () => {
    runs = 0;
    caught.length = 0;
    const key = randomUUID();
    const first = await raw(edge.url, '/page', { key, body: { name: 'bob' } }).answer;
    expect({ status: first.status, text: first.text }).toEqual({ status: 201, text: '<h1>Hello bob #1</h1>' });
    for (let i = 0; i < 2; i++) {
      const again = await raw(edge.url, '/page', { key, body: { name: 'bob' } }).answer;
      expect({ status: again.status, replayed: replayed(again), text: again.text, type: again.headers['content-type'] }).toEqual({
        status: 201,
        replayed: true,
        text: first.text,
        type: first.headers['content-type'],
      });
    }
    expect({ runs, caught: caught.map(String) }).toEqual({ runs: 1, caught: [] });
  });
});
