// Shared helpers for the guard-edge-*.e2e-spec.ts files: a tiny Nest app on either adapter with the
// guard on a given store, and a raw HTTP client that keeps bytes and can abort.
import { Module, type DynamicModule, type INestApplication, type Type, type Provider } from '@nestjs/common';
import { NestFactory } from '@nestjs/core';
import { ExpressAdapter } from '@nestjs/platform-express';
import { FastifyAdapter } from '@nestjs/platform-fastify';
import { request as httpRequest, type IncomingHttpHeaders } from 'node:http';
import { IdempotencyModule, type IdempotencyModuleOptions } from '../../libs/idempotency/src/index.js';
import { eventually } from './eventually.js';

export type Adapter = 'express' | 'fastify';

export interface EdgeApp {
  app: INestApplication;
  url: string;
  close(): Promise<void>;
}

export async function makeApp(
  adapter: Adapter,
  controllers: Type<unknown>[],
  options: IdempotencyModuleOptions = {},
  extra: { providers?: Provider[]; setup?: (app: INestApplication) => void | Promise<void>; imports?: DynamicModule[] } = {},
): Promise<EdgeApp> {
  @Module({})
  class EdgeModule {}
  const module: DynamicModule = {
    module: EdgeModule,
    imports: [IdempotencyModule.forRoot(options), ...(extra.imports ?? [])],
    controllers,
    providers: extra.providers ?? [],
  };
  const app =
    adapter === 'fastify'
      ? await NestFactory.create(module, new FastifyAdapter(), { logger: ['error'] as const, abortOnError: false })
      : await NestFactory.create(module, new ExpressAdapter(), { logger: ['error'] as const, abortOnError: false });
  await extra.setup?.(app);
  await app.listen(0, '127.0.0.1');
  const address = app.getHttpServer().address() as { port: number };
  return { app, url: `http://127.0.0.1:${address.port}`, close: () => app.close() };
}

export interface RawAnswer {
  status: number;
  headers: IncomingHttpHeaders;
  body: Buffer;
  text: string;
  /** The response ended with an error (socket reset, aborted). */
  error?: string;
}

export interface RawOptions {
  method?: string;
  headers?: Record<string, string>;
  body?: unknown;
  key?: string;
  timeoutMs?: number;
  agent?: import('node:http').Agent | false;
}

export function raw(url: string, path: string, options: RawOptions = {}): { answer: Promise<RawAnswer>; abort: () => void } {
  const payload =
    options.body === undefined ? undefined : typeof options.body === 'string' ? options.body : JSON.stringify(options.body);
  const headers: Record<string, string> = { ...(options.headers ?? {}) };
  if (payload !== undefined && !headers['content-type']) headers['content-type'] = 'application/json';
  if (options.key) headers['idempotency-key'] = options.key;
  let abort = () => undefined as void;
  const answer = new Promise<RawAnswer>((resolve) => {
    const req = httpRequest(`${url}${path}`, { method: options.method ?? 'POST', headers, agent: options.agent ?? false }, (res) => {
      const chunks: Buffer[] = [];
      res.on('data', (chunk: Buffer) => chunks.push(chunk));
      const done = (error?: string) => {
        const body = Buffer.concat(chunks);
        resolve({ status: res.statusCode ?? 0, headers: res.headers, body, text: body.toString('utf8'), error });
      };
      res.on('end', () => done());
      res.on('error', (e) => done(e.message));
      res.on('aborted', () => done('aborted'));
    });
    const timer = setTimeout(() => {
      req.destroy(new Error('client timeout'));
    }, options.timeoutMs ?? 5000);
    req.on('close', () => clearTimeout(timer));
    req.on('error', (e) => resolve({ status: 0, headers: {}, body: Buffer.alloc(0), text: '', error: e.message }));
    abort = () => req.destroy();
    req.end(payload);
  });
  return { answer, abort: () => abort() };
}

export const send = (url: string, path: string, options: RawOptions = {}) => raw(url, path, options).answer;

export const sleep = (ms: number) => new Promise((resolve) => setTimeout(resolve, ms));

export const until = (check: () => boolean | Promise<boolean>, timeoutMs = 3000, what = 'condition'): Promise<void> =>
  eventually(check, { timeoutMs, intervalMs: 10, what });

export const replayed = (a: RawAnswer) => a.headers['idempotent-replayed'] === 'true';
export const codeOf = (a: RawAnswer): string | undefined => {
  try {
    return JSON.parse(a.text).code;
  } catch {
    return undefined;
  }
};
