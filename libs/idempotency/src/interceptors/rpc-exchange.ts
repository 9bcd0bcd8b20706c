import { Logger, StreamableFile, type CallHandler, type ExecutionContext } from '@nestjs/common';
import { Readable } from 'node:stream';
import { isObservable, of, type Observable } from 'rxjs';
import { IdempotencyErrorCode, keyInvalidMessage } from '../errors/idempotency-http.exceptions.js';
import { canonicalJson, type FingerprintInput } from '../keys/fingerprint.js';
import { watchRmqSettlement } from '../messages/rmq-settlement.js';
import type { SkippedMessage, SkippedMessageHandler, SkippedMessageReason } from '../messages/skipped-message.js';
import type { SavedResponse } from '../stores/idempotency-store.js';
import type { GuardExchange, GuardRefusal, HeldClaim } from './exchange.js';
import type { GuardMemory } from './guard-memory.js';
import { runHeld } from './held-run.js';
import { isEventHandler, type GuardedRoute } from './route-options.js';

/** `@nestjs/microservices`' PATTERN_METADATA: the patterns a handler takes, as a list. */
const PATTERN_METADATA = 'microservices:pattern';

type RpcExceptionClass = new (error: object) => Error;
let rpcException: Promise<RpcExceptionClass> | undefined;
/** The class, once loaded: later messages get their exchange without a promise. */
let loadedRpcException: RpcExceptionClass | undefined;

/**
 * A message to a `@MessagePattern` (request-response) or `@EventPattern` handler. Messages have
 * no user (see `MESSAGE_USER`). A duplicate message gets the saved result; a duplicate event is
 * dropped (the handler does not run). Refusals of messages are `RpcException`s with
 * `{ code, message }`. The saved result is the handler's first value as JSON text, saved before
 * it is sent on (a failure after it leaves it saved: the client got it). A result JSON cannot
 * hold (a BigInt, an object that refers to itself, a Buffer, a stream) is not kept, but the run
 * is: a duplicate event is dropped, and a duplicate message is refused
 * `IDEMPOTENCY_RESPONSE_NOT_REPLAYABLE` (its record says `not_serializable`); the handler never
 * runs again.
 */
export class RpcExchange implements GuardExchange {
  private readonly isEvent: boolean;
  private keyHandlerSegment: string | undefined;

  private constructor(
    private readonly ctx: ExecutionContext,
    private readonly route: GuardedRoute,
    private readonly RpcException: RpcExceptionClass,
    private readonly memory: GuardMemory,
    private readonly onSkipped: SkippedMessageHandler | undefined,
  ) {
    this.isEvent = isEventHandler(ctx.getHandler());
  }

  /** Loads `@nestjs/microservices` (an optional peer) on the first message: a promise until then. */
  static create(ctx: ExecutionContext, route: GuardedRoute, memory: GuardMemory, onSkipped?: SkippedMessageHandler): RpcExchange | Promise<RpcExchange> {
    if (loadedRpcException) return new RpcExchange(ctx, route, loadedRpcException, memory, onSkipped);
    rpcException ??= import('@nestjs/microservices').then((m) => (loadedRpcException = m.RpcException as RpcExceptionClass));
    return rpcException.then((RpcException) => new RpcExchange(ctx, route, RpcException, memory, onSkipped));
  }

  /**
   * A handler of several patterns (`@EventPattern(['order.created', 'order.cancelled'])`) keys
   * each pattern apart: keyed by an order number, its `order.cancelled` was taken for a copy of the
   * order's `order.created` and dropped. So does a pattern with wildcards, by what it matched.
   * The pattern as the transport tells it (RabbitMQ and TCP `getPattern()`, Redis `getChannel()`,
   * NATS `getSubject()`, MQTT and Kafka `getTopic()`). A handler of one pattern, matched as
   * written, keeps its handler's name, as HTTP routes do.
   */
  keyHandler(): string {
    // Read once a message: the fingerprint and the storage key both ask.
    return (this.keyHandlerSegment ??= this.keyHandlerOfMessage());
  }

  private keyHandlerOfMessage(): string {
    const patterns: unknown = Reflect.getMetadata(PATTERN_METADATA, this.ctx.getHandler());
    if (!Array.isArray(patterns) || patterns.length === 0) return this.route.handler;
    const context: unknown = this.ctx.switchToRpc().getContext();
    const pattern = messagePatternOf(context);
    if (pattern === undefined) return this.route.handler;
    // One pattern that matched another subject or topic (a wildcard: NATS `shops.*.orders`, MQTT
    // `shops/+/orders`, Redis with `wildcards`) names what it matched: keyed as its handler, one
    // shop's order number answered another shop's order with the first shop's result.
    if (patterns.length === 1 && pattern === patternText(patterns[0], context)) return this.route.handler;
    return `${this.route.handler}#${pattern}`;
  }

  /** The message's payload, under its key's handler segment. */
  fingerprintInput(): FingerprintInput {
    return { method: 'RPC', path: this.keyHandler(), body: this.ctx.switchToRpc().getData() };
  }

  run(next: CallHandler, claim: HeldClaim): Observable<unknown> {
    const rmqRun = watchRmqSettlement(this.ctx);
    return runHeld(
      rmqRun ? rmqRun.around(() => next.handle()) : next.handle(),
      {
        succeeded: async (value) => {
          // A handler that nacked or rejected its message reported a failure without throwing.
          if (rmqRun?.settlement() === 'nacked') return claim.release();
          let body = serialize(value);
          if (typeof body === 'string' && !this.isEvent) body = await serializedAsNestWould(value, this.ctx, body);
          // Its effect happened: releasing the key let every redelivery run it again. An event's
          // result goes nowhere, and its record needs none; a message's duplicate is told it is not kept.
          if (body === null && this.isEvent) return claim.save({ statusCode: 0, headers: {} });
          if (body === null) {
            const { handler } = this.route;
            this.memory.onceFor(`${handler}:unkept`, () =>
              logger.warn(
                `${handler}: its result cannot be kept as JSON (a BigInt, an object that refers to itself, a Buffer, a stream), so a ` +
                  'duplicate message is refused IDEMPOTENCY_RESPONSE_NOT_REPLAYABLE (the handler does not run again). Return plain data to have it replayed.',
              ),
            );
            return claim.save({ statusCode: 0, headers: {}, unreplayable: 'not_serializable' });
          }
          if (body === undefined) return claim.save({ statusCode: 0, headers: {} });
          // Unbounded, one result of 2 MB was kept in the store for each key (an adversarial helper).
          if (Buffer.byteLength(body) > this.route.maxResponseBytes) {
            return claim.save(this.isEvent ? { statusCode: 0, headers: {} } : { statusCode: 0, headers: {}, unreplayable: 'too_large' });
          }
          return claim.save({ statusCode: 0, headers: {}, body });
        },
        // A handler that acked its message before it failed settled it as done (an ack that threw
        // on a channel that closed meanwhile): its effect happened, and releasing the key let the
        // redelivery run it again. Kept, with no result to replay.
        failed: () =>
          rmqRun?.settlement() === 'acked'
            ? claim.save(this.isEvent ? { statusCode: 0, headers: {} } : { statusCode: 0, headers: {}, unreplayable: 'server_error' })
            : claim.release(),
      },
      claim.holdMs,
    );
  }

  get runsWhileClosing(): boolean {
    return this.isEvent && !this.onSkipped;
  }

  private skipped(reason: SkippedMessageReason, retryAfterMs?: number): void {
    if (!this.onSkipped) return;
    const skipped: SkippedMessage = { reason, answered: !this.isEvent };
    if (retryAfterMs !== undefined) skipped.retryAfterMs = retryAfterMs;
    settleSkipped(this.onSkipped, this.ctx, skipped, this.route.handler);
  }

  replay(saved: SavedResponse): Observable<unknown> {
    this.skipped('replayed');
    if (saved.unreplayable) {
      if (this.isEvent) return of(undefined);
      throw new this.RpcException({
        code: IdempotencyErrorCode.RESPONSE_NOT_REPLAYABLE,
        message: 'A message with this key was already handled, but its result was not kept.',
      });
    }
    return of(saved.body === undefined ? undefined : JSON.parse(saved.body));
  }

  refuse(refusal: GuardRefusal): Observable<unknown> {
    if (refusal.reason === 'in_progress') this.skipped('in_progress', refusal.retryAfterMs);
    else this.skipped(refusal.reason === 'store_unavailable' ? 'store_unavailable' : 'rejected');
    if (this.isEvent && refusal.reason === 'key_reused') {
      // Dropped, as a copy is: said, as an HTTP call or a message would be told 422.
      const { handler } = this.route;
      this.memory.onceFor(`${handler}:reused`, () =>
        logger.warn(`${handler}: an event came with a key already used with another payload; it is dropped (IDEMPOTENCY_KEY_REUSED)`),
      );
      return of(undefined);
    }
    if (this.isEvent && refusal.reason === 'in_progress') return of(undefined);
    const error = toRpcError(refusal);
    // Nest logs nothing an event handler's interceptor throws: an event without a usable key was
    // dropped unsaid (an adversarial helper). The outage is the outage log's.
    if (this.isEvent && refusal.reason !== 'store_unavailable') {
      const { handler } = this.route;
      this.memory.onceFor(`${handler}:${error.code}`, () =>
        logger.warn(`${handler}: an event was refused and dropped (${error.code}: ${error.message}); said once per handler and code`),
      );
    }
    throw new this.RpcException(error);
  }
}

/**
 * The pattern a message came with, as its transport's context tells it; undefined where it does
 * not. An object pattern (`{ cmd: 'sum' }`, JSON in the message) as sorted JSON: Nest routes its
 * keys in any order to one handler, and a publisher other than Nest's client may not sort them.
 */
function messagePatternOf(context: unknown): string | undefined {
  if (typeof context !== 'object' || context === null) return undefined;
  for (const name of ['getPattern', 'getChannel', 'getSubject', 'getTopic']) {
    const read = (context as Record<string, unknown>)[name];
    if (typeof read !== 'function') continue;
    const pattern: unknown = read.call(context);
    if (typeof pattern === 'string') return pattern.startsWith('{') ? sortedJson(pattern) : pattern;
  }
  return undefined;
}

/**
 * A declared pattern as `messagePatternOf` writes a message's: a string as it is, an object as
 * sorted JSON. On MQTT, a shared subscription's `$share/<group>/` goes, as Nest's `ServerMqtt`
 * takes it off to match the topic it hands over (helper-210: kept, a `$share` instance keyed its
 * messages apart from a plain one's, and each ran them).
 */
function patternText(pattern: unknown, context: unknown): string | undefined {
  if (typeof pattern !== 'string') return canonicalJson(pattern);
  const mqtt = typeof (context as { getPacket?: unknown }).getPacket === 'function';
  return mqtt && pattern.startsWith('$share/') ? pattern.split('/').slice(2).join('/') : pattern;
}

function sortedJson(text: string): string {
  try {
    return canonicalJson(JSON.parse(text)) ?? text;
  } catch {
    return text;
  }
}

/** Settles a message whose handler does not run (`onSkippedMessage`); a failure to is logged, never thrown. */
function settleSkipped(onSkipped: SkippedMessageHandler, ctx: ExecutionContext, skipped: SkippedMessage, handler: string): void {
  const failed = (error: unknown) =>
    logger.error(`${handler}: onSkippedMessage failed for a ${skipped.reason} message: ${(error as Error)?.message ?? String(error)}`);
  try {
    const settled = onSkipped(ctx, skipped);
    if (settled instanceof Promise) settled.catch(failed);
  } catch (error) {
    failed(error);
  }
}

const logger = new Logger('Idempotency');

function toRpcError(refusal: GuardRefusal): { code: string; message: string; retryAfterMs?: number } {
  switch (refusal.reason) {
    case 'user_unresolved':
      // Messages have no user to resolve (MESSAGE_USER): only an HTTP request meets this one.
      return { code: IdempotencyErrorCode.USER_UNRESOLVED, message: 'The server cannot tell which user sent this message.' };
    case 'key_invalid':
      return { code: IdempotencyErrorCode.KEY_INVALID, message: keyInvalidMessage(refusal.problem) };
    case 'payload_unsupported':
      return { code: IdempotencyErrorCode.PAYLOAD_UNSUPPORTED, message: refusal.problem };
    case 'key_missing':
      return { code: IdempotencyErrorCode.KEY_MISSING, message: `The message has no idempotency key (${refusal.source}).` };
    case 'in_progress':
      return {
        code: IdempotencyErrorCode.IN_PROGRESS,
        message: 'A message with this key is still being processed: send it again later.',
        retryAfterMs: refusal.retryAfterMs,
      };
    case 'key_reused':
      return { code: IdempotencyErrorCode.KEY_REUSED, message: 'This key was already used with another payload.' };
    case 'store_unavailable':
      return {
        code: IdempotencyErrorCode.STORE_UNAVAILABLE,
        message: refusal.shuttingDown ? 'This instance is shutting down: send the message again.' : 'The idempotency store is unavailable.',
      };
  }
}

/** The result as JSON text: undefined for no value, null when JSON cannot hold it. */
/** class-transformer, where the app has it (an optional peer of Nest's `ClassSerializerInterceptor`); null where not. */
let classTransformer: Promise<ClassTransformer | null> | undefined;
interface ClassTransformer {
  instanceToPlain(value: unknown, options?: object): unknown;
  plainToInstance(type: unknown, value: unknown, options?: object): unknown;
}
/** `@SerializeOptions()`' metadata key (`@nestjs/common`'s `CLASS_SERIALIZER_OPTIONS`). */
const SERIALIZE_OPTIONS = 'class_serializer:options';

/**
 * A message's result as Nest's `ClassSerializerInterceptor` sends it, where the app has
 * class-transformer: `instanceToPlain` under the route's `@SerializeOptions()` (the method's,
 * else the class's; `type` as Nest applies it). The guard runs inside the app's interceptors, so
 * the value it sees is the handler's own: saved as its plain JSON, a duplicate got the
 * `@Exclude()`d `passwordHash` the first caller never saw, and the store kept it (adversarial
 * helpers, two rounds). Where the transform throws (an `@Expose()` getter over a relation not
 * loaded: the first caller got an error), nothing is kept: null. Options given to the
 * interceptor itself (`new ClassSerializerInterceptor(reflector, { ... })`) are not seen here.
 */
async function serializedAsNestWould(value: unknown, ctx: ExecutionContext, json: string): Promise<string | null> {
  if (value === null || typeof value !== 'object') return json;
  classTransformer ??= import('class-transformer').then(
    (module) => module as unknown as ClassTransformer,
    () => null,
  );
  const transformer = await classTransformer;
  if (!transformer) return json;
  const options = (Reflect.getMetadata(SERIALIZE_OPTIONS, ctx.getHandler()) ?? Reflect.getMetadata(SERIALIZE_OPTIONS, ctx.getClass()) ?? {}) as {
    type?: new (...args: never[]) => unknown;
  };
  const toPlain = (item: unknown): unknown => {
    if (!item || typeof item !== 'object') return item;
    if (!options.type || item instanceof options.type) return transformer.instanceToPlain(item, options);
    return transformer.instanceToPlain(transformer.plainToInstance(options.type, item, options), options);
  };
  try {
    return JSON.stringify(Array.isArray(value) ? value.map(toPlain) : toPlain(value));
  } catch {
    return null;
  }
}

function serialize(value: unknown): string | undefined | null {
  if (value === undefined) return undefined;
  if (!isJsonable(value)) return null;
  try {
    return JSON.stringify(value);
  } catch {
    return null; // BigInt, cycles
  }
}

function isJsonable(value: unknown): boolean {
  if (value === null || typeof value !== 'object') return typeof value !== 'function' && typeof value !== 'symbol';
  return !(
    value instanceof StreamableFile ||
    value instanceof Readable ||
    value instanceof ReadableStream ||
    Buffer.isBuffer(value) ||
    ArrayBuffer.isView(value) ||
    isObservable(value) ||
    Symbol.asyncIterator in value
  );
}
