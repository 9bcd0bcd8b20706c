// Answers to the first request's Range or precondition headers: a 206 with ten bytes of an
// export and its Content-Range, a 416, a 412 to an If-Match that did not match. Saved as the
// request's answer, they were replayed to duplicates that never asked for them: the ten bytes
// without their Content-Range (a client saved them as the whole file), a 412 to a retry without
// If-Match (an adversarial helper, with Express's res.download and @fastify/static's
// reply.download). Such an answer is kept as not replayable: duplicates get 409
// IDEMPOTENCY_RESPONSE_NOT_REPLAYABLE, and the handler still runs once. The handler here honours
// Range and If-Match itself, as `send` does: the guard sees only the answer.
import { afterAll, beforeAll, describe, expect, it } from '@jest/globals';
import { Controller, Headers, Post, Res } from '@nestjs/common';
import { randomUUID } from 'node:crypto';
import { NoRepeatSubmit } from '../libs/idempotency/src/index.js';
import { codeOf, makeApp, replayed, send, type Adapter, type EdgeApp } from './support/edge-app.js';

const FILE = 'x'.repeat(100);
const ETAG = '"v1"';
let runs = 0;

type Reply = { status(code: number): unknown; header?(name: string, value: string): unknown; setHeader?(name: string, value: string): unknown };
const setHeader = (res: Reply, name: string, value: string) => (res.header ? res.header(name, value) : res.setHeader!(name, value));

@Controller('exports')
class ExportsController {
  @Post()
  @NoRepeatSubmit()
  create(
    @Headers('range') range: string | undefined,
    @Headers('if-match') ifMatch: string | undefined,
    @Headers('if-none-match') ifNoneMatch: string | undefined,
    @Res({ passthrough: true }) res: Reply,
  ) {
    runs++;
    setHeader(res, 'ETag', ETAG);
    if ((ifMatch !== undefined && ifMatch !== ETAG) || ifNoneMatch === '*') {
      res.status(412);
      return 'precondition failed';
    }
    const part = /^bytes=(\d+)-(\d+)$/.exec(range ?? '');
    if (!part) return FILE;
    const [start, end] = [Number(part[1]), Number(part[2])];
    if (start >= FILE.length) {
      res.status(416);
      setHeader(res, 'Content-Range', `bytes */${FILE.length}`);
      return '';
    }
    // Nest's own status over a partial file (@fastify/static's reply.download under a POST: 201).
    if (range?.startsWith('bytes=0-')) res.status(206);
    setHeader(res, 'Content-Range', `bytes ${start}-${end}/${FILE.length}`);
    return FILE.slice(start, end + 1);
  }
}

describe.each<Adapter>(['express', 'fastify'])('an answer to the first request\'s Range or precondition headers (%s)', (adapter) => {
  let a: EdgeApp;
  beforeAll(async () => {
    a = await makeApp(adapter, [ExportsController]);
  });
  afterAll(async () => a?.close());

  it.each<[string, Record<string, string>, number]>([
    ['a part (206)', { range: 'bytes=0-9' }, 206],
    ['a part under a 201 with its Content-Range', { range: 'bytes=1-10' }, 201],
    ['a range not satisfiable (416)', { range: 'bytes=500-600' }, 416],
    ['a failed precondition (412)', { 'if-match': '"old"' }, 412],
    ['a create-only precondition that failed (If-None-Match: *, 412)', { 'if-none-match': '*' }, 412],
  ])('%s is never replayed to a duplicate; the handler ran once', async (_name, headers, status) => {
    runs = 0;
    const key = randomUUID();
    const first = await send(a.url, '/exports', { key, headers });
    const plain = await send(a.url, '/exports', { key });
    const same = await send(a.url, '/exports', { key, headers });
    // Observed before: both replayed the first answer (status, ten bytes, no Content-Range).
    expect({ first: first.status, plain: [plain.status, codeOf(plain), replayed(plain)], same: [same.status, codeOf(same)], runs }).toEqual({
      first: status,
      plain: [409, 'IDEMPOTENCY_RESPONSE_NOT_REPLAYABLE', false],
      same: [409, 'IDEMPOTENCY_RESPONSE_NOT_REPLAYABLE'],
      runs: 1,
    });
  });

  it('(control) a whole answer to a Range the handler did not honour, or to a matching If-Match, replays', async () => {
    runs = 0;
    for (const headers of [{ range: 'lines=1-2' }, { 'if-match': ETAG }] as Record<string, string>[]) {
      const key = randomUUID();
      const first = await send(a.url, '/exports', { key, headers });
      const again = await send(a.url, '/exports', { key });
      expect({ first: first.status, again: again.status, body: again.text, replayed: replayed(again) }).toEqual({ first: 201, again: 201, body: FILE, replayed: true });
    }
    expect(runs).toBe(2);
  });
});
