// "A real app": the guard in an app wired the way users wire theirs (global prefix, URI
// versioning, JWT-shaped users, a global ClassSerializerInterceptor, Nest docs' TimeoutInterceptor,
// a { data } envelope, the app's own exception filter), on Express or Fastify, on each store; and a
// raw HTTP client that keeps the answer's bytes.
import {
  Body,
  Catch,
  ClassSerializerInterceptor,
  Controller,
  HttpCode,
  HttpException,
  Injectable,
  Module,
  Post,
  Req,
  RequestTimeoutException,
  Res,
  StreamableFile,
  VersioningType,
  type ArgumentsHost,
  type CallHandler,
  type CanActivate,
  type ExceptionFilter,
  type ExecutionContext,
  type INestApplication,
  type NestInterceptor,
} from '@nestjs/common';
import { APP_FILTER, APP_GUARD, APP_INTERCEPTOR, HttpAdapterHost, NestFactory, Reflector } from '@nestjs/core';
import { ExpressAdapter } from '@nestjs/platform-express';
import { FastifyAdapter } from '@nestjs/platform-fastify';
import { TypeOrmModule } from '@nestjs/typeorm';
import { Exclude } from 'class-transformer';
import { randomUUID } from 'node:crypto';
import { STATUS_CODES, request as httpRequest, type ClientRequest, type IncomingHttpHeaders } from 'node:http';
import { Observable, TimeoutError, catchError, map, of, throwError, timeout } from 'rxjs';
import { DataSource } from 'typeorm';
import {
  IDEMPOTENCY_DEFAULTS,
  IdempotencyModule,
  IdempotencyStore,
  NoRepeatSubmit,
  buildStorageKey,
  type IdempotencyModuleOptions,
} from '../../libs/idempotency/src/index.js';
import { IDEMPOTENCY_ENTITIES, IDEMPOTENCY_MIGRATIONS, PostgresIdempotencyStore } from '../../libs/idempotency/src/typeorm/index.js';
import { eventually } from './eventually.js';
import { DATABASE_URL, REDIS_URL } from './services.js';
import { createTestSchema, dropTestSchema, testSchemaName } from './test-schema.js';

/** The entity users return from a controller; the global ClassSerializerInterceptor drops `passwordHash`. */
export class User {
  id!: string;
  email!: string;
  @Exclude()
  passwordHash!: string;
  constructor(fields: User) {
    Object.assign(this, fields);
  }
}

/** Counts handler runs (started and finished) per route, and lets a test hold runs at a gate. */
@Injectable()
export class RealAppProbe {
  private readonly started = new Map<string, number>();
  private readonly ended = new Map<string, number>();
  private gate: Promise<void> = Promise.resolve();
  private readonly opens: (() => void)[] = [];

  runs = (route: string): number => this.started.get(route) ?? 0;
  finished = (route: string): number => this.ended.get(route) ?? 0;

  /** Runs that reach the gate from now on wait until `release()`. */
  hold(): void {
    this.gate = new Promise((resolve) => this.opens.push(resolve));
  }

  release(): void {
    this.opens.splice(0).forEach((open) => open());
    this.gate = Promise.resolve();
  }

  reset(): void {
    this.release();
    this.started.clear();
    this.ended.clear();
  }

  /** Counts a run of `route` (synchronously, when the handler is called) and returns its number. */
  enter(route: string): number {
    const run = this.runs(route) + 1;
    this.started.set(route, run);
    return run;
  }

  /** A whole run: counted, held at the gate, then `make` builds the value. */
  async run<T>(route: string, make: (run: number) => T): Promise<T> {
    const run = this.enter(route);
    await this.gate;
    const value = make(run);
    this.ended.set(route, this.finished(route) + 1);
    return value;
  }
}

/** Nest's JWT recipe: `Authorization: Bearer <name>` gives `{ sub, username }`; `Bearer nosub` a user without id or sub. */
@Injectable()
class BearerAuthGuard implements CanActivate {
  canActivate(ctx: ExecutionContext): boolean {
    const req = ctx.switchToHttp().getRequest<{ headers: Record<string, string | undefined>; user?: unknown }>();
    const match = /^Bearer (.+)$/.exec(req.headers.authorization ?? '');
    if (!match) return true; // anonymous calls are allowed
    // Header values are latin1 on the wire: a name outside it comes percent-encoded.
    const name = decodeURIComponent(match[1]);
    req.user = name === 'nosub' ? { username: 'x' } : { sub: name, username: name };
    return true;
  }
}

/** Nest docs' TimeoutInterceptor. */
class TimeoutInterceptor implements NestInterceptor {
  constructor(private readonly ms: number) {}
  intercept(_ctx: ExecutionContext, next: CallHandler): Observable<unknown> {
    return next.handle().pipe(
      timeout(this.ms),
      catchError((err) => (err instanceof TimeoutError ? throwError(() => new RequestTimeoutException()) : throwError(() => err))),
    );
  }
}

/** Wraps every JSON body as `{ data }` (binary answers pass as they are). */
@Injectable()
class EnvelopeInterceptor implements NestInterceptor {
  intercept(_ctx: ExecutionContext, next: CallHandler): Observable<unknown> {
    return next.handle().pipe(map((data) => (data instanceof StreamableFile || Buffer.isBuffer(data) ? data : { data })));
  }
}

/** The app's own error format: `{ error: { status, code, message } }`, keeping a `code` the exception carries. */
@Catch()
class AppExceptionFilter implements ExceptionFilter {
  constructor(private readonly adapterHost: HttpAdapterHost) {}
  catch(exception: unknown, host: ArgumentsHost): void {
    const status = exception instanceof HttpException ? exception.getStatus() : 500;
    const body = exception instanceof HttpException ? exception.getResponse() : undefined;
    const fields = typeof body === 'object' && body !== null ? (body as { code?: string; message?: unknown }) : {};
    const code = fields.code ?? (STATUS_CODES[status] ?? 'ERROR').toUpperCase().replace(/\W+/g, '_');
    const message = fields.message ?? (typeof body === 'string' ? body : 'Internal server error');
    this.adapterHost.httpAdapter.reply(host.switchToHttp().getResponse(), { error: { status, code, message } }, status);
  }
}

/** Bytes no UTF-8 decoder keeps: NULs, a lone continuation byte, 0xFF/0xFE, a truncated sequence. */
export const BINARY = Buffer.from([0x00, 0xff, 0xfe, 0x80, 0x41, 0x00, 0xc3, 0x28, 0xe2, 0x82, 0x00, 0x7f]);
export const BIG_BODY_BYTES = 2 * 1024 * 1024;

type AuthedRequest = { user?: { sub?: string } };
const ownerOf = (req: AuthedRequest) => req.user?.sub ?? 'anonymous';

@Controller({ path: 'users', version: '1' })
@NoRepeatSubmit({ expireSeconds: 60 })
export class UsersController {
  constructor(
    private readonly probe: RealAppProbe,
    private readonly adapterHost: HttpAdapterHost,
  ) {}

  @Post()
  create(@Body() body: { email: string }, @Req() req: AuthedRequest, @Res({ passthrough: true }) res: unknown) {
    return this.probe.run('create', (run) => {
      const id = `${ownerOf(req)}-${run}`;
      this.adapterHost.httpAdapter.setHeader(res, 'Location', `/api/v1/users/${encodeURIComponent(id)}`);
      // A user's own data: no shared cache may keep it, the replay included.
      this.adapterHost.httpAdapter.setHeader(res, 'Cache-Control', 'private, no-store');
      return new User({ id, email: body.email, passwordHash: `$argon2id$secret-hash-${id}` });
    });
  }

  @Post('invitations')
  invite(@Body() body: { email: string }) {
    return this.probe.run('invite', (run) => ({ invited: body.email, run }));
  }

  @Post('events')
  events(): Observable<{ seq: number; run: number }> {
    const run = this.probe.enter('events');
    return of(1, 2, 3).pipe(map((seq) => ({ seq, run })));
  }

  @Post('purge')
  @HttpCode(204)
  purge() {
    return this.probe.run('purge', () => null);
  }

  /** 204 decided at run time (a status other than the route's 201), as `res.status(204)` does. */
  @Post('purge-now')
  purgeNow(@Res({ passthrough: true }) res: unknown) {
    return this.probe.run('purgeNow', () => {
      this.adapterHost.httpAdapter.status(res, 204);
      return null;
    });
  }

  /** Held at the probe's gate as long as the test wants: longer than the outer timeout. */
  @Post('slow')
  slow() {
    return this.probe.run('slow', (run) => ({ done: true, run }));
  }

  @Post('avatar')
  avatar() {
    return this.probe.run('avatar', () => Buffer.from(BINARY));
  }

  @Post('avatar-file')
  avatarFile() {
    return this.probe.run('avatarFile', () => new StreamableFile(Buffer.from(BINARY), { type: 'application/octet-stream', disposition: 'attachment; filename="avatar.bin"' }));
  }

  @Post('export')
  export() {
    return this.probe.run('export', (run) => ({ run, blob: 'x'.repeat(BIG_BODY_BYTES) }));
  }

  @Post('lookup')
  @NoRepeatSubmit({ useRequestFingerprint: true })
  lookup(@Body() body: { email: string }) {
    return this.probe.run('lookup', (run) => ({ found: body.email, run }));
  }

  @Post('imports')
  @NoRepeatSubmit({ idempotentKey: '#body.ref' })
  import(@Req() req: AuthedRequest) {
    return this.probe.run('import', (run) => ({ importedBy: ownerOf(req).length, run }));
  }
}

export type AdapterName = 'express' | 'fastify';
export type StoreName = 'memory' | 'redis' | 'postgres';

export interface RealAppOptions {
  adapter: AdapterName;
  store: StoreName;
  /** Redis of the `redis` store. Default the shared one. */
  redisUrl?: string;
  /**
   * The TimeoutInterceptor's limit. Default 10 s: storms of 200 requests queue for the store's
   * connections longer than a tight limit. The outer-timeout tests pass 300 ms.
   */
  timeoutMs?: number;
  /** More module options (e.g. `anonymous`). */
  idempotency?: Partial<IdempotencyModuleOptions>;
}

export interface RealApp {
  app: INestApplication;
  url: string;
  probe: RealAppProbe;
  store: IdempotencyStore;
  /** The store key of `UsersController.<method>` for a `sub` user and a client key. */
  storageKey(sub: string, method: string, key: string): string;
  close(): Promise<void>;
}

/** The idempotency module as each store is configured in an app (PostgreSQL: TypeORM, its own schema, migrations). */
function idempotencyImports(options: RealAppOptions, keyPrefix: string, schema: string) {
  const extra = options.idempotency ?? {};
  switch (options.store) {
    case 'memory':
      return [IdempotencyModule.forRoot({ ...extra })];
    case 'redis':
      return [IdempotencyModule.forRoot({ store: { redis: options.redisUrl ?? REDIS_URL }, keyPrefix, ...extra })];
    case 'postgres':
      return [
        TypeOrmModule.forRoot({
          type: 'postgres',
          url: DATABASE_URL,
          schema,
          entities: IDEMPOTENCY_ENTITIES,
          migrations: IDEMPOTENCY_MIGRATIONS,
          migrationsRun: true,
          retryAttempts: 0,
        }),
        IdempotencyModule.forRootAsync({
          inject: [DataSource],
          useFactory: (dataSource: DataSource) => ({ store: new PostgresIdempotencyStore(dataSource), ...extra }),
        }),
      ];
  }
}

/** A users' app: global prefix, URI versioning, JWT-shaped users, global serializer, timeout, envelope, filter. */
export async function createRealApp(options: RealAppOptions): Promise<RealApp> {
  const keyPrefix = `real-app-${randomUUID()}`;
  const schema = testSchemaName();
  if (options.store === 'postgres') await createTestSchema(schema);

  @Module({
    imports: idempotencyImports(options, keyPrefix, schema),
    controllers: [UsersController],
    providers: [
      RealAppProbe,
      { provide: APP_GUARD, useClass: BearerAuthGuard },
      { provide: APP_INTERCEPTOR, useClass: EnvelopeInterceptor },
      { provide: APP_FILTER, useClass: AppExceptionFilter },
    ],
  })
  class RealAppModule {}

  const logger = process.env.REAL_APP_LOG ? (['error', 'warn'] as ('error' | 'warn')[]) : false;
  let app: INestApplication;
  try {
    app =
      options.adapter === 'fastify'
        ? await NestFactory.create(
            RealAppModule,
            new FastifyAdapter({ routerOptions: { ignoreTrailingSlash: true, caseSensitive: false } }),
            { logger },
          )
        : await NestFactory.create(RealAppModule, new ExpressAdapter(), { logger });
    app.setGlobalPrefix('api');
    app.enableVersioning({ type: VersioningType.URI });
    app.useGlobalInterceptors(new ClassSerializerInterceptor(app.get(Reflector)), new TimeoutInterceptor(options.timeoutMs ?? 10_000));
    await app.listen(0, '127.0.0.1');
  } catch (error) {
    if (options.store === 'postgres') await dropTestSchema(schema);
    throw error;
  }
  const { port } = app.getHttpServer().address() as { port: number };
  const prefix = options.store === 'redis' ? keyPrefix : (options.idempotency?.keyPrefix ?? IDEMPOTENCY_DEFAULTS.keyPrefix);
  return {
    app,
    url: `http://127.0.0.1:${port}`,
    probe: app.get(RealAppProbe),
    store: app.get(IdempotencyStore),
    storageKey: (sub, method, key) =>
      buildStorageKey({ prefix, user: { id: sub }, handler: `UsersController.${method}`, key }),
    async close() {
      await app.close();
      if (options.store === 'postgres') await dropTestSchema(schema);
    },
  };
}

/** One answer, its body as raw bytes. */
export interface Answer {
  status: number;
  headers: IncomingHttpHeaders;
  body: Buffer;
  /** The parsed JSON body (undefined when empty). */
  json(): any;
  /** `error.code` of the app's error format. */
  code: string | undefined;
}

export interface SendOptions {
  /** The user's name for `Authorization: Bearer`, or none for an anonymous call. */
  as?: string;
  key?: string;
  body?: unknown;
  headers?: Record<string, string>;
  /** The client's loopback address. Default 127.0.0.1; another one (127.0.0.2) is another client. */
  from?: string;
}

/** Starts a POST; `abort()` destroys the request (the client goes away). */
export function start(baseUrl: string, path: string, { as, key, body, headers = {}, from }: SendOptions = {}) {
  const payload = body === undefined ? undefined : Buffer.from(JSON.stringify(body));
  const all: Record<string, string | number> = { ...headers };
  if (payload) {
    all['content-type'] = 'application/json';
    all['content-length'] = payload.length;
  }
  if (as !== undefined) all.authorization = `Bearer ${encodeURIComponent(as)}`;
  if (key !== undefined) all['idempotency-key'] = key;
  let req!: ClientRequest;
  const answer = new Promise<Answer>((resolve, reject) => {
    // A connection of its own: no idle keep-alive socket the server may close under a reused request.
    req = httpRequest(`${baseUrl}${path}`, { method: 'POST', headers: all, agent: false, localAddress: from }, (res) => {
      const chunks: Buffer[] = [];
      res.on('data', (chunk: Buffer) => chunks.push(chunk));
      res.on('error', reject);
      res.on('end', () => {
        const bytes = Buffer.concat(chunks);
        const json = () => (bytes.length === 0 ? undefined : JSON.parse(bytes.toString('utf8')));
        let code: string | undefined;
        try {
          code = json()?.error?.code;
        } catch {
          code = undefined;
        }
        resolve({ status: res.statusCode ?? 0, headers: res.headers, body: bytes, json, code });
      });
    });
    req.on('error', reject);
    req.end(payload);
  });
  return { answer, abort: () => req.destroy() };
}

/** Sends a POST and waits for the whole answer. */
export const send = (baseUrl: string, path: string, options?: SendOptions): Promise<Answer> => start(baseUrl, path, options).answer;

/** Polls `check` every 10 ms until it holds, failing after `timeoutMs`. */
export const until = (check: () => boolean | Promise<boolean>, timeoutMs = 5000, what = 'condition'): Promise<void> =>
  eventually(check, { timeoutMs, intervalMs: 10, what });

/** Sends until the answer is no longer 409 IDEMPOTENCY_IN_PROGRESS (bounded), and returns the last one. */
export async function sendPastInProgress(baseUrl: string, path: string, options: SendOptions, timeoutMs = 3000): Promise<Answer> {
  const deadline = Date.now() + timeoutMs;
  for (;;) {
    const answer = await send(baseUrl, path, options);
    if (answer.code !== 'IDEMPOTENCY_IN_PROGRESS' || Date.now() > deadline) return answer;
    await new Promise((resolve) => setTimeout(resolve, 25));
  }
}

/** Every adapter with every store. */
export const EVERY_APP: [AdapterName, StoreName][] = (['express', 'fastify'] as const).flatMap((adapter) =>
  (['memory', 'redis', 'postgres'] as const).map((store): [AdapterName, StoreName] => [adapter, store]),
);

/** How an answer reads in a summary: `201`, `201 replayed`, `409 IDEMPOTENCY_IN_PROGRESS`. */
export const outcome = (answer: Answer): string =>
  [answer.status, answer.headers['idempotent-replayed'] === 'true' ? 'replayed' : answer.code].filter(Boolean).join(' ');

/** The record as text, with a base64 body decoded, to search for what must not be stored. */
export function recordText(record: unknown): string {
  const response = (record as { response?: { body?: string; encoding?: string } } | undefined)?.response;
  const decoded = response?.encoding === 'base64' && response.body ? Buffer.from(response.body, 'base64').toString('latin1') : '';
  return JSON.stringify(record ?? null) + decoded;
}
