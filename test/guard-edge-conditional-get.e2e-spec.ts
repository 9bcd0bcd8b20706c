// A guarded GET on Express, whose res.json() answers a conditional request (If-None-Match that
// matches the body's ETag) 304 Not Modified, without a body. That 304 is the answer saved. A
// retry of the key from a client without the representation (no validator, or another one) was
// replayed the empty 304 (found by an adversarial helper in session 14, run in session 15): it
// now gets 409 RESPONSE_NOT_REPLAYABLE, and a retry whose validators match still gets the 304.
// On a `@Res({ passthrough: true })` route, each 304 replay threw ERR_HTTP_HEADERS_SENT into the
// app's exception filter (round 2 of session 15's review): the guard read the passthrough from the
// wrong metadata, took the route for one that sends its own answer, and sent the replay before
// Nest sent the value, whose 304 Express then stripped of headers already sent.
import { afterAll, beforeAll, describe, expect, it } from '@jest/globals';
import { ArgumentsHost, Catch, Controller, Get, Res, type INestApplication } from '@nestjs/common';
import { BaseExceptionFilter } from '@nestjs/core';
import { randomUUID } from 'node:crypto';
import { IdempotencyErrorCode, NoRepeatSubmit } from '../libs/idempotency/src/index.js';
import { codeOf, makeApp, replayed, send, sleep, type EdgeApp } from './support/edge-app.js';

let runs = 0;
const REPORT = '{"total":42}';
const caught: unknown[] = [];

/** The app's catch-all filter: records what reaches it, then answers as Nest would. */
@Catch()
class SeenFilter extends BaseExceptionFilter {
  override catch(exception: unknown, host: ArgumentsHost) {
    caught.push(exception);
    super.catch(exception, host);
  }
}

@Controller()
class ReportsController {
  @Get('report')
  @NoRepeatSubmit()
  report() {
    runs++;
    return { total: 42 };
  }

  /** A passthrough route whose handler answers through the response itself (an OAuth callback's redirect). */
  @Get('passthrough-redirect')
  @NoRepeatSubmit()
  passthroughRedirect(@Res({ passthrough: true }) res: { redirect(status: number, url: string): void }) {
    runs++;
    res.redirect(303, `/there/${runs}`);
  }

  @Get('passthrough')
  @NoRepeatSubmit()
  passthrough(@Res({ passthrough: true }) res: { setHeader(name: string, value: string): void }) {
    runs++;
    res.setHeader('x-report', 'yes');
    return { total: 42 };
  }
}

describe('a guarded GET answered 304 Not Modified (express)', () => {
  let edge: EdgeApp;
  let etag: string;
  beforeAll(async () => {
    edge = await makeApp('express', [ReportsController], { keyPrefix: `conditional-${randomUUID()}` }, {
      setup: (app: INestApplication) => {
        app.useGlobalFilters(new SeenFilter(app.getHttpAdapter()));
      },
    });
    etag = String((await send(edge.url, '/report', { method: 'GET', key: randomUUID() })).headers.etag);
  });
  afterAll(async () => edge?.close());

  /** A first request with a key whose validator matches: Express answers 304. */
  async function notModifiedFirst(): Promise<string> {
    runs = 0;
    const key = randomUUID();
    const first = await send(edge.url, '/report', { method: 'GET', key, headers: { 'if-none-match': etag } });
    expect({ status: first.status, text: first.text, runs }).toEqual({ status: 304, text: '', runs: 1 });
    return key;
  }

  it.each([
    ['no validator', {}],
    ['another entity tag', { 'if-none-match': '"other"' }],
    ['an If-Modified-Since only (no Last-Modified is saved by default)', { 'if-modified-since': new Date().toUTCString() }],
    ['the same entity tag and Cache-Control: no-cache', { 'cache-control': 'no-cache' }],
  ])('refuses the saved 304 to a retry with %s, and the handler ran once', async (what, headers: Record<string, string>) => {
    const key = await notModifiedFirst();
    const validators = what.startsWith('the same entity tag') ? { ...headers, 'if-none-match': etag } : headers;
    const retry = await send(edge.url, '/report', { method: 'GET', key, headers: validators });
    expect({ status: retry.status, code: codeOf(retry), runs }).toEqual({
      status: 409,
      code: IdempotencyErrorCode.RESPONSE_NOT_REPLAYABLE,
      runs: 1,
    });
  });

  it.each([
    ['the same entity tag', () => etag],
    ['the tag compared weakly, in a list', () => `"x", ${etag.replace(/^W\//, '')}`],
    ['the tag in a list separated by spaces', () => `"x" ${etag}`],
    ['*', () => '*'],
  ])('replays the saved 304 to a retry with %s', async (_what, validator) => {
    const key = await notModifiedFirst();
    const retry = await send(edge.url, '/report', { method: 'GET', key, headers: { 'if-none-match': validator() } });
    expect({ status: retry.status, replayed: replayed(retry), text: retry.text, runs }).toEqual({
      status: 304,
      replayed: true,
      text: '',
      runs: 1,
    });
  });

  it('replays a saved 200 with its body to a conditional retry', async () => {
    runs = 0;
    const key = randomUUID();
    const first = await send(edge.url, '/report', { method: 'GET', key });
    const retry = await send(edge.url, '/report', { method: 'GET', key, headers: { 'if-none-match': etag } });
    expect([first.status, first.text, retry.status, replayed(retry), retry.text, runs]).toEqual([200, REPORT, 200, true, REPORT, 1]);
  });

  it('replays a passthrough route (@Res({ passthrough: true })) as Nest sends it: a 304 and a 200, nothing thrown in the app', async () => {
    caught.length = 0;
    runs = 0;
    const key = randomUUID();
    const first = await send(edge.url, '/passthrough', { method: 'GET', key, headers: { 'if-none-match': etag } });
    const notModified = await send(edge.url, '/passthrough', { method: 'GET', key, headers: { 'if-none-match': etag } });
    const other = randomUUID();
    const full = await send(edge.url, '/passthrough', { method: 'GET', key: other });
    const replay = await send(edge.url, '/passthrough', { method: 'GET', key: other });
    expect([first.status, notModified.status, replayed(notModified), full.status, replay.status, replayed(replay), replay.text, runs]).toEqual([
      304, 304, true, 200, 200, true, REPORT, 2,
    ]);
    await sleep(50);
    expect(caught).toEqual([]);
  });

  // Round 3: with the passthrough read right, a passthrough handler that answers through the
  // response itself (a redirect) had its answer taken for someone else's (a timeout's), saved as
  // never delivered, and its retry got 409 IDEMPOTENCY_RESPONSE_NOT_REPLAYABLE.
  it('replays the answer a passthrough handler sent itself (a redirect)', async () => {
    caught.length = 0;
    runs = 0;
    const key = randomUUID();
    const first = await send(edge.url, '/passthrough-redirect', { method: 'GET', key });
    const retry = await send(edge.url, '/passthrough-redirect', { method: 'GET', key });
    expect([first.status, first.headers.location, retry.status, retry.headers.location, replayed(retry), runs]).toEqual([
      303, '/there/1', 303, '/there/1', true, 1,
    ]);
    await sleep(50);
    expect(caught).toEqual([]);
  });
});
