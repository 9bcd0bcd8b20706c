// A StreamableFile whose stream fails before its first byte (the file is gone, a bucket refuses
// the read): Nest answers it 400 "Bad Request" on Express, 500 on Fastify. The guard saved the
// Express 400 as the request's answer and replayed it to every retry for the key's retention (an
// adversarial helper). It is the app's answer to a failed read, kept as not replayable as the
// 500 is: retries get 409 IDEMPOTENCY_RESPONSE_NOT_REPLAYABLE on both adapters, and the handler
// ran once.
import { afterAll, beforeAll, describe, expect, it } from '@jest/globals';
import { Controller, Post, StreamableFile } from '@nestjs/common';
import { randomUUID } from 'node:crypto';
import { createReadStream } from 'node:fs';
import { join } from 'node:path';
import { tmpdir } from 'node:os';
import { NoRepeatSubmit } from '../libs/idempotency/src/index.js';
import { codeOf, makeApp, replayed, send, type Adapter, type EdgeApp } from './support/edge-app.js';

let runs = 0;

@Controller('exports')
class ExportsController {
  @Post('gone')
  @NoRepeatSubmit()
  gone() {
    runs++;
    return new StreamableFile(createReadStream(join(tmpdir(), `missing-${randomUUID()}.pdf`)), { type: 'application/pdf' });
  }

  @Post('ok')
  @NoRepeatSubmit()
  ok() {
    runs++;
    return new StreamableFile(Buffer.from('%PDF-1.7 tiny'), { type: 'application/pdf' });
  }
}

describe.each<Adapter>(['express', 'fastify'])('a StreamableFile whose stream fails (%s)', (adapter) => {
  let a: EdgeApp;
  beforeAll(async () => {
    a = await makeApp(adapter, [ExportsController]);
  });
  afterAll(async () => a?.close());

  it('is never replayed: retries get 409 IDEMPOTENCY_RESPONSE_NOT_REPLAYABLE, the handler ran once', async () => {
    runs = 0;
    const key = randomUUID();
    const first = await send(a.url, '/exports/gone', { key });
    const again = await send(a.url, '/exports/gone', { key });
    // Observed before on Express: 400, then the 400 again with Idempotent-Replayed: true.
    expect({ first: first.status >= 400, again: [again.status, codeOf(again), replayed(again)], runs }).toEqual({
      first: true,
      again: [409, 'IDEMPOTENCY_RESPONSE_NOT_REPLAYABLE', false],
      runs: 1,
    });
  });

  it('(control) a file that streams is replayed byte for byte', async () => {
    runs = 0;
    const key = randomUUID();
    const first = await send(a.url, '/exports/ok', { key });
    const again = await send(a.url, '/exports/ok', { key });
    expect({ first: first.text, again: again.text, replayed: replayed(again), runs }).toEqual({ first: '%PDF-1.7 tiny', again: '%PDF-1.7 tiny', replayed: true, runs: 1 });
  });
});
