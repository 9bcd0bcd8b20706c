import {
  BadRequestException,
  Body,
  Controller,
  Header,
  HttpCode,
  Injectable,
  Module,
  Post,
  Req,
  StreamableFile,
  type DynamicModule,
  type INestApplication,
} from '@nestjs/common';
import { of } from 'rxjs';
import { NestFactory } from '@nestjs/core';
import { ExpressAdapter, type NestExpressApplication } from '@nestjs/platform-express';
import { FastifyAdapter, type NestFastifyApplication } from '@nestjs/platform-fastify';
import { Readable } from 'node:stream';
import { ContentDigest, ContentHash, IdempotencyModule, NoRepeatSubmit, type IdempotencyModuleOptions } from '../../libs/idempotency/src/index.js';

/** Counts handler runs and lets a test hold runs until it opens the gate. */
@Injectable()
export class Probe {
  runs = 0;
  failuresLeft = 0;
  private gate: Promise<void> = Promise.resolve();
  private readonly opens: (() => void)[] = [];

  /** Runs that start from now on wait until `release()`. */
  hold(): void {
    this.gate = new Promise((resolve) => this.opens.push(resolve));
  }

  /** Runs that start from now on pass; runs already held stay held until `release()`. */
  letNewRunsThrough(): void {
    this.gate = Promise.resolve();
  }

  release(): void {
    this.opens.splice(0).forEach((open) => open());
    this.gate = Promise.resolve();
  }

  async run<T>(value: T): Promise<T> {
    this.runs++;
    await this.gate;
    if (this.failuresLeft > 0) {
      this.failuresLeft--;
      throw new BadRequestException({ statusCode: 400, message: 'planned failure', code: 'PLANNED_FAILURE' });
    }
    return value;
  }
}

@Controller()
class GuardTestController {
  constructor(private readonly probe: Probe) {}

  /** The key is the Idempotency-Key header. */
  @Post('payments')
  @Header('Location', '/payments/1')
  @Header('Set-Cookie', 'session=secret')
  @NoRepeatSubmit({ expireSeconds: 60 })
  pay(@Body() body: Record<string, unknown>) {
    return this.probe.run({ paid: body, run: this.probe.runs + 1 });
  }

  /** Falls back to the request fingerprint when no key is sent. */
  @Post('fingerprinted')
  @NoRepeatSubmit({ useRequestFingerprint: true, ignoreFields: ['timestamp'] })
  fingerprinted(@Body() body: Record<string, unknown>) {
    return this.probe.run({ got: body, run: this.probe.runs + 1 });
  }

  /** Duplicates wait for the first result instead of a 409. */
  @Post('waiting')
  @NoRepeatSubmit({ waitForResultMs: 10_000 })
  waiting(@Body() body: Record<string, unknown>) {
    return this.probe.run({ got: body, run: this.probe.runs + 1 });
  }

  @Post('waiting-briefly')
  @NoRepeatSubmit({ waitForResultMs: 200 })
  waitingBriefly() {
    return this.probe.run({ run: this.probe.runs + 1 });
  }

  /**
   * A lease shorter than the handler can take, never renewed (`maxHoldSeconds` = the lease). 2 s:
   * at 0.3 s, a machine that stalled the test between the claim and its first retry let that
   * retry take the key over before the test saw it refused.
   */
  @Post('short-lease')
  @NoRepeatSubmit({ leaseSeconds: 2, maxHoldSeconds: 2 })
  shortLease() {
    return this.probe.run({ run: this.probe.runs + 1 });
  }

  @Post('closed')
  @NoRepeatSubmit({ failMode: 'closed' })
  closed() {
    return this.probe.run({ ok: true });
  }

  @Post('stream')
  @NoRepeatSubmit()
  async stream() {
    await this.probe.run(null);
    return new StreamableFile(Readable.from([Buffer.from('chunk')]));
  }

  @Post('text')
  @HttpCode(200)
  @NoRepeatSubmit({ idempotentKey: "#headers['x-request-id']" })
  text() {
    return this.probe.run(`plain text ${this.probe.runs + 1}`);
  }

  /** Not guarded: the SHA-256 of the body bytes `@ContentDigest()` found (or its 415). */
  @Post('digest')
  @HttpCode(200)
  @ContentDigest()
  digest(@ContentHash() contentHash: string) {
    return { contentHash };
  }

  /** Keyed by a function that reads what the client sent, as users write them (`body.ref` may be anything). */
  @Post('refs')
  @NoRepeatSubmit({ idempotentKey: (ctx) => ctx.switchToHttp().getRequest<{ body?: { ref?: string } }>().body?.ref })
  ref() {
    return this.probe.run({ run: this.probe.runs + 1 });
  }

  /** A key function written async by mistake. */
  @Post('async-key')
  @NoRepeatSubmit({ idempotentKey: (async () => 'k') as unknown as () => string })
  asyncKey() {
    return this.probe.run({ run: this.probe.runs + 1 });
  }

  /** A key function that returns an Observable by mistake. */
  @Post('observable-key')
  @NoRepeatSubmit({ idempotentKey: (() => of('k')) as unknown as () => string })
  observableKey() {
    return this.probe.run({ run: this.probe.runs + 1 });
  }

  @Post('tenants/:tenant/jobs')
  @NoRepeatSubmit({ idempotentKey: (ctx) => ctx.switchToHttp().getRequest<{ params: { tenant: string } }>().params.tenant })
  job(@Req() req: { params: { tenant: string } }) {
    return this.probe.run({ tenant: req.params.tenant });
  }
}

@Module({})
class GuardTestModule {
  static register(options: IdempotencyModuleOptions): DynamicModule {
    return {
      module: GuardTestModule,
      imports: [IdempotencyModule.forRoot(options)],
      controllers: [GuardTestController],
      providers: [Probe],
    };
  }
}

export type AdapterName = 'express' | 'fastify';

/**
 * A small app whose routes exercise each behaviour of the guard, on either adapter. Created
 * without `rawBody` unless `rawBody` says so. Its parsers: JSON and forms (Nest's defaults), XML
 * (Express: text, a string; Fastify: a Buffer), text/plain (a string on both) and
 * application/octet-stream (a Buffer on both); none for other types.
 */
export async function createGuardTestApp(
  adapter: AdapterName,
  options: IdempotencyModuleOptions,
  { rawBody = false }: { rawBody?: boolean } = {},
): Promise<INestApplication> {
  const module = GuardTestModule.register(options);
  const appOptions = { rawBody, logger: ['error' as const] };
  const xml = ['application/xml', 'text/xml'];
  const bytes = ['application/octet-stream'];
  let app: INestApplication;
  if (adapter === 'fastify') {
    const fastify = await NestFactory.create<NestFastifyApplication>(module, new FastifyAdapter(), appOptions);
    fastify.useBodyParser([...xml, ...bytes]);
    app = fastify;
  } else {
    const express = await NestFactory.create<NestExpressApplication>(module, new ExpressAdapter(), appOptions);
    express.useBodyParser('text', { type: [...xml, 'text/plain'] });
    express.useBodyParser('raw', { type: bytes });
    app = express;
  }
  await app.init();
  if (adapter === 'fastify') await (app.getHttpAdapter().getInstance() as { ready(): Promise<void> }).ready();
  return app;
}
