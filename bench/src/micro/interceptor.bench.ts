import 'reflect-metadata';
import { Controller, Injectable, Module, Post, type CallHandler, type NestInterceptor, type Type } from '@nestjs/common';
import { NestFactory } from '@nestjs/core';
import { ExecutionContextHost } from '@nestjs/core/helpers/execution-context-host.js';
import { ExpressAdapter } from '@nestjs/platform-express';
import { createRequire } from 'node:module';
import { IncomingMessage, ServerResponse } from 'node:http';
import { Socket } from 'node:net';
import { pathToFileURL } from 'node:url';
import { lastValueFrom, of, type Observable } from 'rxjs';
import {
  IdempotencyInterceptor,
  IdempotencyModule,
  IdempotencyStore,
  MemoryIdempotencyStore,
  NoRepeatSubmit,
  type ClaimInput,
  type ClaimResult,
} from '../../../libs/idempotency/src/index.js';
import { loadPeer } from '../arms/peer.js';
import { requireFromPeers } from '../paths.js';

/**
 * What each interceptor's own JavaScript costs per call, with no HTTP and no network: its
 * `intercept()` on a ready request, then the handler's Observable to the end and the answer sent
 * on a Node.js response (the guard saves what is sent), in a loop, ns per call (median of rounds). The throughput phase cannot see a few microseconds on this machine;
 * this can. Arms: an empty interceptor; this guard on a store that answers at once (first
 * request: acquired + saved; replay: completed), so only the guard's code is timed; this guard
 * and the peer each on its memory store (the store that costs each least).
 * `node dist/bench/src/micro/interceptor.bench.js [calls] [--json]`.
 */

export interface InterceptorResult {
  /** Median ns per call over rounds. */
  emptyInterceptor: number;
  guardUnique: number;
  guardReplay: number;
  /** This guard on its memory store. */
  guardMemoryUnique: number;
  guardMemoryReplay: number;
  peerUnique?: number;
  peerReplay?: number;
}

const RESPONSE = { id: 1, orderNo: 'A-1', amount: 100, status: 'PENDING' };

/** A store that answers at once, so that the time measured is the guard's own. */
class ImmediateStore extends IdempotencyStore {
  replaying = false;
  private readonly saved = { statusCode: 201, headers: {}, body: JSON.stringify(RESPONSE) };
  claim(input: ClaimInput): Promise<ClaimResult> {
    return Promise.resolve(
      this.replaying ? { status: 'completed', response: this.saved } : { status: 'acquired', token: input.token },
    );
  }
  complete(): Promise<boolean> {
    return Promise.resolve(true);
  }
  release(): Promise<boolean> {
    return Promise.resolve(true);
  }
  renew(): Promise<boolean> {
    return Promise.resolve(true);
  }
  get(): Promise<undefined> {
    return Promise.resolve(undefined);
  }
}

@Injectable()
class EmptyInterceptor implements NestInterceptor {
  intercept(_ctx: unknown, next: CallHandler) {
    return next.handle();
  }
}

function controllerWith(decorator: MethodDecorator): Type {
  @Controller()
  class OrdersController {
    @Post('orders')
    @decorator
    create() {
      return RESPONSE;
    }
  }
  return OrdersController;
}

async function appOf(imports: unknown[], controller: Type, providers: Type[] = []) {
  @Module({ imports: imports as [], controllers: [controller], providers })
  class AppModule {}
  const app = await NestFactory.create(AppModule, new ExpressAdapter(), { logger: ['error'] });
  await app.init();
  return app;
}

/** Express's request and response prototypes, from the Express that Nest's adapter runs on. */
const express = createRequire(createRequire(import.meta.url).resolve('@nestjs/platform-express'))('express') as {
  request: object;
  response: object;
};

/**
 * Node's request and response classes with Express's methods, built once (as fast to construct
 * as Node's own: instances made with `Object.setPrototypeOf` or `Reflect.construct` onto Express's
 * prototypes cost ~100 µs each and drowned what the bench measures).
 */
class ExpressRequest extends IncomingMessage {}
class ExpressResponse extends ServerResponse {}
Object.defineProperties(ExpressRequest.prototype, Object.getOwnPropertyDescriptors(express.request));
Object.defineProperties(ExpressResponse.prototype, Object.getOwnPropertyDescriptors(express.response));
// `ip` and `query` are getters on Express's request: a fixed value for every request.
Object.defineProperties(ExpressRequest.prototype, { ip: { value: '127.0.0.1' }, query: { value: {}, writable: true } });

let sequence = 0;
/**
 * A fresh request and Node.js response as Express hands them over (Express's prototypes: the
 * peer answers a replay with `res.status()`): the guard reads the answer off the response, so
 * each call also sends one (`answer`).
 */
function contextOf(controller: Type, key: string | undefined) {
  const headers: Record<string, string> = { 'content-type': 'application/json', 'idempotency-key': key ?? `k-${++sequence}` };
  const req = Object.assign(new ExpressRequest(new Socket()), {
    method: 'POST',
    url: '/orders',
    originalUrl: '/orders',
    headers,
    body: { orderNo: 'A-1', amount: 100 },
    params: {},
  });
  const res = new ExpressResponse(req);
  Object.assign(req, { res });
  Object.assign(res, { req });
  res.statusCode = 201;
  return { ctx: new ExecutionContextHost([req, res, () => undefined], controller, controller.prototype.create), res };
}

/** Sends the value as Express's `res.json` would, and waits until the response has ended. */
async function answer(res: ServerResponse, value: unknown): Promise<void> {
  res.setHeader('content-type', 'application/json; charset=utf-8');
  res.end(JSON.stringify(value));
  // The guard holds the end until its save settles (microtasks on a store that answers at once).
  for (let i = 0; i < 1000 && !res.writableEnded; i++) await Promise.resolve();
}

type Intercept = (ctx: ExecutionContextHost, next: CallHandler) => Observable<unknown> | Promise<Observable<unknown>>;

async function timeCalls(intercept: Intercept, controller: Type, calls: number, key?: string): Promise<number> {
  const next: CallHandler = { handle: () => of(RESPONSE) };
  const started = process.hrtime.bigint();
  for (let i = 0; i < calls; i++) {
    const { ctx, res } = contextOf(controller, key);
    await answer(res, await lastValueFrom(await intercept(ctx, next)));
  }
  return Number(process.hrtime.bigint() - started) / calls;
}

const median = (values: number[]) => [...values].sort((a, b) => a - b)[values.length >> 1];

/** One arm of the bench: an interceptor on the controller it guards, and the key its calls send (a fixed one: replays). */
interface Arm {
  intercept: Intercept;
  controller: Type;
  key?: string;
}

/** The arms, each on its own Nest app; the peer's are absent where it is not installed. */
export const ARM_NAMES = ['floor', 'guard-unique', 'guard-replay', 'guard-memory-unique', 'guard-memory-replay', 'peer-unique', 'peer-replay'] as const;
export type InProcessArm = (typeof ARM_NAMES)[number];

async function armsFor(maxCalls: number): Promise<Partial<Record<InProcessArm, Arm>> & { setReplaying(on: boolean): void }> {
  const store = new ImmediateStore();
  const guarded = controllerWith(NoRepeatSubmit());
  const guardApp = await appOf([IdempotencyModule.forRoot({ store })], guarded);
  const guard = guardApp.get(IdempotencyInterceptor);
  const guardedInMemory = controllerWith(NoRepeatSubmit());
  // Room for every key of the run: at the default 100,000 records (one hour's retention) the
  // store was full from the third round on, and the arm timed its "memory store full" error; at
  // the default 64 MiB its answers went unreplayable and its claims full from the third round on
  // (session 35: 23.2 against 16.7 µs a first request).
  const memoryStore = new MemoryIdempotencyStore({ maxEntries: maxCalls + 1, maxBytes: Number.POSITIVE_INFINITY });
  const memoryApp = await appOf([IdempotencyModule.forRoot({ store: memoryStore })], guardedInMemory);
  const guardInMemory = memoryApp.get(IdempotencyInterceptor);
  const empty = new EmptyInterceptor();
  const inMemory: Intercept = (ctx, next) => guardInMemory.intercept(ctx, next);
  const arms: Partial<Record<InProcessArm, Arm>> & { setReplaying(on: boolean): void } = {
    setReplaying: (on) => (store.replaying = on),
    floor: { intercept: (ctx, next) => empty.intercept(ctx, next), controller: controllerWith(() => undefined) },
    'guard-unique': { intercept: (ctx, next) => guard.intercept(ctx, next), controller: guarded },
    'guard-replay': { intercept: (ctx, next) => guard.intercept(ctx, next), controller: guarded, key: 'replayed' },
    'guard-memory-unique': { intercept: inMemory, controller: guardedInMemory },
    'guard-memory-replay': { intercept: inMemory, controller: guardedInMemory, key: 'replayed' },
  };
  try {
    const { NodeIdempotencyModule, Idempotent } = loadPeer();
    const { NodeIdempotencyInterceptor } = requireFromPeers('@node-idempotency/nestjs') as { NodeIdempotencyInterceptor: Type };
    const controller = controllerWith(Idempotent());
    const peerApp = await appOf([NodeIdempotencyModule.forRootAsync({ storage: { adapter: 'memory' } })], controller);
    const interceptor = peerApp.get<{ intercept: Intercept }>(NodeIdempotencyInterceptor);
    const intercept: Intercept = (ctx, next) => interceptor.intercept(ctx, next);
    arms['peer-unique'] = { intercept, controller };
    arms['peer-replay'] = { intercept, controller, key: 'replayed' };
  } catch (error) {
    process.stderr.write(`interceptor bench: the peer is not installed (${(error as Error).message.split('\n')[0]})\n`);
  }
  return arms;
}

/** Times `calls` calls of one arm; ns per call. The guard's replay arm reads a completed record from its store. */
async function timeArm(arms: Awaited<ReturnType<typeof armsFor>>, name: InProcessArm, calls: number): Promise<number | undefined> {
  const arm = arms[name];
  if (!arm) return undefined;
  arms.setReplaying(name === 'guard-replay');
  return timeCalls(arm.intercept, arm.controller, calls, arm.key);
}

export async function runInterceptorBench(calls = 50_000, rounds = 5): Promise<InterceptorResult> {
  const arms = await armsFor(calls * rounds);
  const samples: Record<keyof InterceptorResult, number[]> = {
    emptyInterceptor: [],
    guardUnique: [],
    guardReplay: [],
    guardMemoryUnique: [],
    guardMemoryReplay: [],
    peerUnique: [],
    peerReplay: [],
  };
  const keys: [keyof InterceptorResult, InProcessArm][] = [
    ['emptyInterceptor', 'floor'],
    ['guardUnique', 'guard-unique'],
    ['guardReplay', 'guard-replay'],
    ['guardMemoryUnique', 'guard-memory-unique'],
    ['guardMemoryReplay', 'guard-memory-replay'],
    ['peerUnique', 'peer-unique'],
    ['peerReplay', 'peer-replay'],
  ];
  for (let round = 0; round < rounds; round++) {
    for (const [sample, arm] of keys) {
      const ns = await timeArm(arms, arm, calls);
      if (ns !== undefined) samples[sample].push(ns);
    }
  }
  const result: InterceptorResult = {
    emptyInterceptor: median(samples.emptyInterceptor),
    guardUnique: median(samples.guardUnique),
    guardReplay: median(samples.guardReplay),
    guardMemoryUnique: median(samples.guardMemoryUnique),
    guardMemoryReplay: median(samples.guardMemoryReplay),
  };
  if (samples.peerUnique.length > 0) {
    result.peerUnique = median(samples.peerUnique);
    result.peerReplay = median(samples.peerReplay);
  }
  return result;
}

/** The bench run as it is, and again with V8's allocation-site pretenuring off (see `deferred-end.bench.ts`). */
export interface InProcessRuns {
  asIs: InterceptorResult;
  noPretenuring: InterceptorResult;
}

export function interceptorTable({ asIs, noPretenuring }: InProcessRuns): string {
  const us = (ns: number | undefined) => (ns === undefined ? '—' : (ns / 1000).toFixed(2));
  const row = (label: string, unique: keyof InterceptorResult, replay: keyof InterceptorResult) =>
    `| ${label} | ${us(asIs[unique])} | ${us(asIs[replay])} | ${us(noPretenuring[unique])} | ${us(noPretenuring[replay])} |`;
  return [
    '| µs per call (median) | first request | replay | first request, no pretenuring | replay, no pretenuring |',
    '|---|---:|---:|---:|---:|',
    row('an empty interceptor (the floor)', 'emptyInterceptor', 'emptyInterceptor'),
    row("this guard, a store that answers at once (the guard's own code + the floor)", 'guardUnique', 'guardReplay'),
    row('this guard, its memory store', 'guardMemoryUnique', 'guardMemoryReplay'),
    row('@node-idempotency/nestjs (its memory adapter)', 'peerUnique', 'peerReplay'),
  ].join('\n');
}

if (import.meta.url === pathToFileURL(process.argv[1]).href) {
  const calls = Number(process.argv.find((arg) => /^\d+$/.test(arg)) ?? 50_000);
  const armFlag = process.argv.indexOf('--arm');
  if (armFlag !== -1) {
    // One arm, one round: what instructions.bench.ts counts under callgrind.
    const name = process.argv[armFlag + 1] as InProcessArm;
    if (!ARM_NAMES.includes(name)) throw new Error(`--arm must be one of ${ARM_NAMES.join(', ')}`);
    const ns = await timeArm(await armsFor(calls), name, calls);
    if (ns === undefined) process.exit(3);
    process.stdout.write(`${JSON.stringify({ arm: name, calls, ns })}\n`);
    process.exit(0);
  }
  const result = await runInterceptorBench(calls);
  // Alone, one run: as JSON (what the bench reads), or as a line per arm.
  if (process.argv.includes('--json')) process.stdout.write(`${JSON.stringify(result)}\n`);
  else for (const [arm, ns] of Object.entries(result)) console.log(`${arm}: ${(ns / 1000).toFixed(2)} µs`);
  process.exit(0);
}
