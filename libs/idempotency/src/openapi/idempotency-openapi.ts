import { HttpStatus, RequestMethod } from '@nestjs/common';
import { HTTP_CODE_METADATA, METHOD_METADATA, PATH_METADATA } from '@nestjs/common/constants.js';
import {
  ContentHashErrorCode,
  contentHashEncodingUnsupported,
  contentHashInvalid,
  contentHashMismatch,
  contentHashMissing,
  contentHashUnavailable,
  type ContentHashHttpException,
} from '../content-digest/content-digest.exceptions.js';
import type { ContentDigestOptions } from '../content-digest/content-digest.guard.js';
import type { NoRepeatSubmitMetadata } from '../decorators/no-repeat-submit.metadata.js';
import {
  IdempotencyErrorCode,
  inProgress,
  keyInvalid,
  keyMissing,
  keyReused,
  payloadUnsupported,
  responseNotReplayable,
  storeUnavailable,
  userUnresolved,
  type IdempotencyHttpException,
} from '../errors/idempotency-http.exceptions.js';
import { PROBLEM_JSON_CONTENT_TYPE, PROBLEM_TYPE_PREFIX, type ErrorFormat } from '../errors/problem-details.js';
import { MAX_KEY_LENGTH, REPLAYED_HEADER } from '../idempotency.constants.js';
import type { FailMode } from '../idempotency.options.js';
import { describeKeyPath } from '../keys/key-expression.js';
import { ROUTE_ARGS_METADATA } from '../interceptors/handler-start.js';

/**
 * One answer of the guard or of `@ContentDigest()` as OpenAPI shows it: its code, its status,
 * whether it sends Retry-After, and which of the two gives it.
 */
interface GuardAnswer {
  code: IdempotencyErrorCode | ContentHashErrorCode;
  status: number;
  retryAfter: boolean;
  /** When it is given (and what the client does next), given where the key comes from and whether the route fails open. */
  when: (keySource: string, failsOpen: boolean) => string;
  by: 'guard' | 'digest';
}

/** An answer as a route writes it. */
type RouteAnswer = GuardAnswer & { format: ErrorFormat };

// Keyed by code so the compiler insists on every code; status and Retry-After are read from the
// exception the guard really throws, so this list cannot drift from errors/.
const ANSWERS: Record<IdempotencyErrorCode, { thrown: () => IdempotencyHttpException; when: GuardAnswer['when'] }> = {
  [IdempotencyErrorCode.KEY_MISSING]: { thrown: () => keyMissing(''), when: (source) => `no key in ${source}` },
  [IdempotencyErrorCode.KEY_INVALID]: {
    thrown: () => keyInvalid(''),
    when: () => `the key is not 1-${MAX_KEY_LENGTH} printable characters, or is no one key (sent on two lines, a list, an object, what a template writes for a missing value)`,
  },
  [IdempotencyErrorCode.PAYLOAD_UNSUPPORTED]: { thrown: () => payloadUnsupported(''), when: () => 'the request cannot be fingerprinted (nested too deep, or a body no parser read)' },
  [IdempotencyErrorCode.IN_PROGRESS]: { thrown: () => inProgress(1), when: () => 'a request with this key is still processing: retry after Retry-After seconds with the same key' },
  [IdempotencyErrorCode.RESPONSE_NOT_REPLAYABLE]: {
    thrown: () => responseNotReplayable(''),
    when: () => 'a request with this key already completed, but its response could not be kept for replay: do not retry; read the current state instead',
  },
  [IdempotencyErrorCode.KEY_REUSED]: { thrown: () => keyReused(), when: () => 'the key was already used with another payload: send a new key for a new operation' },
  // An instance shutting down refuses every guarded call, so that its client goes to another.
  [IdempotencyErrorCode.STORE_UNAVAILABLE]: {
    thrown: () => storeUnavailable(1),
    when: (_source, failsOpen) =>
      `${failsOpen ? '' : 'the idempotency store is unreachable (the route fails closed), or '}the app is shutting down: retry after Retry-After seconds with the same key`,
  },
  [IdempotencyErrorCode.USER_UNRESOLVED]: { thrown: () => userUnresolved(), when: () => 'an authenticated request whose user id the guard cannot resolve (a server configuration error)' },
};

/** `@ContentDigest()`'s answers, read from the exceptions its guard throws, as the guard's are. */
const DIGEST_ANSWERS: Record<ContentHashErrorCode, { thrown: () => ContentHashHttpException; when: string }> = {
  [ContentHashErrorCode.MISMATCH]: {
    thrown: () => contentHashMismatch('', '', 0),
    when: 'the digest sent is not the SHA-256 of the bytes received: send the exact bytes hashed, or no digest',
  },
  [ContentHashErrorCode.INVALID]: { thrown: () => contentHashInvalid(''), when: 'Content-Digest, X-Content-Hash or If-Match is not a usable SHA-256 digest' },
  [ContentHashErrorCode.MISSING]: {
    thrown: () => contentHashMissing(),
    when: 'the route requires a digest and none was sent: send Content-Digest: sha-256=:<base64>:, X-Content-Hash: <hex> or If-Match: "sha256:<hex>"',
  },
  [ContentHashErrorCode.UNAVAILABLE]: { thrown: () => contentHashUnavailable(''), when: "the body's bytes cannot be read for its content type: send one of the media types the route accepts" },
  [ContentHashErrorCode.ENCODING_UNSUPPORTED]: { thrown: () => contentHashEncodingUnsupported(''), when: 'the body came under a Content-Encoding: send it without one' },
};

/** Every answer of the guard, then every answer of `@ContentDigest()`. */
function everyAnswer(): GuardAnswer[] {
  const guard = (Object.entries(ANSWERS) as [IdempotencyErrorCode, (typeof ANSWERS)[IdempotencyErrorCode]][]).map(([code, { thrown, when }]) => {
    const exception = thrown();
    return { code, status: exception.getStatus(), retryAfter: exception.retryAfterSeconds !== undefined, when, by: 'guard' as const };
  });
  const digest = (Object.entries(DIGEST_ANSWERS) as [ContentHashErrorCode, (typeof DIGEST_ANSWERS)[ContentHashErrorCode]][]).map(([code, { thrown, when }]) => ({
    code,
    status: thrown().getStatus(),
    retryAfter: false,
    when: () => when,
    by: 'digest' as const,
  }));
  return [...guard, ...digest];
}

/** `answers` grouped by HTTP status, in their order. */
function byStatus(answers: RouteAnswer[]): Map<number, RouteAnswer[]> {
  const grouped = new Map<number, RouteAnswer[]>();
  for (const answer of answers) grouped.set(answer.status, [...(grouped.get(answer.status) ?? []), answer]);
  return grouped;
}

/** An `@ApiResponse()` entry as @nestjs/swagger keeps it in metadata, keyed by status. */
interface ResponseEntry {
  description?: string;
  headers?: Record<string, unknown>;
  [option: string]: unknown;
}

const REFUSED_BY = { guard: 'the idempotency guard', digest: '@ContentDigest' } as const;

/** The answers of one status: each code described, and its body in the format each is written in. */
function guardResponse(status: number, answers: RouteAnswer[], keySource: string, failsOpen: boolean): ResponseEntry {
  const retrying = answers.filter((answer) => answer.retryAfter).map((answer) => answer.code);
  const by = [...new Set(answers.map((answer) => REFUSED_BY[answer.by]))].join(' or ');
  const codesIn = (format: ErrorFormat) => answers.filter((answer) => answer.format === format).map((answer) => answer.code);
  const nest = codesIn('nest');
  const problem = codesIn('problem+json');
  return {
    description: [`Refused by ${by}; \`code\` says why:`, ...answers.map((a) => `- ${a.code}: ${a.when(keySource, failsOpen)}`)].join('\n'),
    ...(retrying.length > 0 && {
      headers: { 'Retry-After': { description: `Seconds to wait before retrying with the same key (with ${retrying.join(', ')})`, schema: { type: 'integer', minimum: 1 } } },
    }),
    ...(problem.length === 0
      ? { schema: nestSchema(status, nest) }
      : nest.length === 0
        ? { content: { [PROBLEM_JSON_CONTENT_TYPE]: { schema: problemSchema(status, problem) } } }
        : { content: { 'application/json': { schema: nestSchema(status, nest) }, [PROBLEM_JSON_CONTENT_TYPE]: { schema: problemSchema(status, problem) } } }),
  };
}

/** Nest's JSON error body with the refusal's `code`, as the guard sends it in the default format. */
function nestSchema(status: number, codes: string[]): Record<string, unknown> {
  return {
    type: 'object',
    required: ['statusCode', 'error', 'message', 'code'],
    properties: {
      statusCode: { type: 'integer', enum: [status] },
      error: { type: 'string' },
      message: { type: 'string', description: 'What to do next' },
      code: { type: 'string', enum: codes },
    },
  };
}

/** RFC 9457 problem details as the guard sends them under `errorFormat: 'problem+json'`. */
function problemSchema(status: number, codes: string[]): Record<string, unknown> {
  return {
    type: 'object',
    required: ['type', 'title', 'status', 'detail', 'code'],
    properties: {
      type: { type: 'string', format: 'uri', enum: codes.map((code) => `${PROBLEM_TYPE_PREFIX}${code}`) },
      title: { type: 'string' },
      status: { type: 'integer', enum: [status] },
      detail: { type: 'string', description: 'What to do next' },
      code: { type: 'string', enum: codes },
    },
  };
}

/**
 * A status the user documents too keeps their entry (their schema, type and examples: rewriting
 * a body they describe could break their clients); the guard's codes join its description and
 * its Retry-After header joins their headers, so neither answer goes missing.
 */
function mergeResponse(theirs: ResponseEntry, ours: ResponseEntry): ResponseEntry {
  const headers = { ...ours.headers, ...theirs.headers };
  return {
    ...theirs,
    description: [theirs.description, ours.description].filter(Boolean).join('\n\n'),
    ...(Object.keys(headers).length > 0 && { headers }),
  };
}

/** What the @nestjs/swagger CLI plugin defines on a compiled controller (`METADATA_FACTORY_NAME`). */
const PLUGIN_METADATA_FACTORY = '_OPENAPI_METADATA_FACTORY';

/**
 * The success response the route has without the guard: the one the swagger CLI plugin infers,
 * else Nest swagger's default (the @HttpCode status, else 201 for POST and 200 otherwise). Swagger
 * adds either only to an operation with no `@ApiResponse()`, so the guard's answers would hide it.
 */
function defaultSuccess(prototype: object, key: string | symbol, handler: object): Record<string, unknown> {
  const status: number =
    Reflect.getMetadata(HTTP_CODE_METADATA, handler) ??
    (Reflect.getMetadata(METHOD_METADATA, handler) === RequestMethod.POST ? HttpStatus.CREATED : HttpStatus.OK);
  for (let proto = prototype; proto && proto !== Object.prototype; proto = Object.getPrototypeOf(proto)) {
    const factory = (proto.constructor as unknown as Record<string, unknown> | undefined)?.[PLUGIN_METADATA_FACTORY];
    if (typeof factory !== 'function') continue;
    const { summary: _s, deprecated: _d, tags: _t, ...inferred } = (factory() as Record<string | symbol, Record<string, unknown> | undefined>)[key] ?? {};
    if (Object.keys(inferred).length > 0) return { status, ...inferred };
  }
  return { status, description: '' };
}

/** What documenting one route needs besides the route: the library, the answers, the module's fail mode. */
interface Documenting {
  swagger: typeof import('@nestjs/swagger');
  answers: GuardAnswer[];
  defaults?: { failMode?: FailMode; keyHeader?: string; required?: boolean; errorFormat?: ErrorFormat };
}

/** Per route handler: its own swagger metadata before the guard's, and the options it was documented under. */
const documentedRoutes = new WeakMap<object, { responses: unknown; parameters: unknown; under: string }>();

function documentRoute(
  { swagger, answers: every, defaults }: Documenting,
  prototype: object,
  key: string | symbol,
  metadata: NoRepeatSubmitMetadata | undefined,
  digest: ContentDigestOptions | undefined,
): void {
  const descriptor = Object.getOwnPropertyDescriptor(prototype, key);
  const handler: unknown = descriptor?.value;
  if (typeof handler !== 'function' || Reflect.getMetadata(PATH_METADATA, handler) === undefined) return;
  const { API_RESPONSE, API_PARAMETERS, API_HEADERS } = swagger.DECORATORS;

  const options = metadata?.options ?? {};
  const keyFrom = metadata?.key;
  const keyHeader = options.keyHeader ?? defaults?.keyHeader ?? 'Idempotency-Key';
  const keySource = keyFrom === undefined ? '' : 'path' in keyFrom ? describeKeyPath(keyFrom.path) : 'header' in keyFrom ? `the ${keyHeader} header` : 'the request';
  const failsOpen = (options.failMode ?? defaults?.failMode) === 'open';
  const format = options.errorFormat ?? defaults?.errorFormat ?? 'nest';
  const required = (options.required ?? defaults?.required ?? true) && !options.useRequestFingerprint;
  // Without a key, a route with required: false never answers KEY_MISSING (helper-219: documented
  // all the same): the call runs unguarded, or on a fingerprint route a known user's is keyed by
  // its fingerprint (helper-220).
  const keyOptional = (options.required ?? defaults?.required ?? true) === false;
  const digestFormat = digest?.errorFormat ?? defaults?.errorFormat ?? 'nest';
  const digestRequired = digest?.required === true;
  const answers: RouteAnswer[] = [];
  for (const answer of every) {
    if (answer.by === 'guard' && metadata && !(keyOptional && answer.code === IdempotencyErrorCode.KEY_MISSING)) answers.push({ ...answer, format });
    if (answer.by === 'digest' && digest && (digestRequired || answer.code !== ContentHashErrorCode.MISSING)) answers.push({ ...answer, format: digestFormat });
  }
  const under = JSON.stringify([metadata !== undefined, keyHeader, keySource, failsOpen, format, required, digest !== undefined, digestFormat, digestRequired]);
  const before = documentedRoutes.get(handler);
  if (before?.under === under) return;
  if (before) {
    // Documented under other options: from the route's own metadata again.
    for (const [name, value] of [[API_RESPONSE, before.responses], [API_PARAMETERS, before.parameters]] as const) {
      if (value === undefined) Reflect.deleteMetadata(name, handler);
      else Reflect.defineMetadata(name, value, handler);
    }
  }
  documentedRoutes.set(handler, {
    responses: before ? before.responses : Reflect.getOwnMetadata(API_RESPONSE, handler),
    parameters: before ? before.parameters : Reflect.getOwnMetadata(API_PARAMETERS, handler),
    under,
  });
  if (!Reflect.hasOwnMetadata(API_RESPONSE, handler)) swagger.ApiResponse(defaultSuccess(prototype, key, handler))(prototype, key, descriptor!);
  const own: Record<string, ResponseEntry> = Reflect.getMetadata(API_RESPONSE, handler);
  const onClass: Record<string, ResponseEntry> = Reflect.getMetadata(API_RESPONSE, prototype.constructor) ?? {};
  const responses = { ...own };
  for (const [status, ofStatus] of byStatus(answers)) {
    const ours = guardResponse(status, ofStatus, keySource, failsOpen);
    const theirs = own[status] ?? onClass[status];
    responses[status] = theirs ? mergeResponse(theirs, ours) : ours;
  }
  Reflect.defineMetadata(API_RESPONSE, responses, handler);

  const isKeyHeader = (p: { in?: string; name?: string }) => p.in === 'header' && p.name?.toLowerCase() === keyHeader.toLowerCase();
  const documentedByUser = [...(Reflect.getMetadata(API_PARAMETERS, handler) ?? []), ...(Reflect.getMetadata(API_HEADERS, prototype.constructor) ?? [])].some(isKeyHeader);
  if (keyFrom !== undefined && 'header' in keyFrom && !documentedByUser) {
    swagger.ApiHeader({
      // Under the name the handler's own @Headers() reads it by, which Swagger documents too: one parameter, not two.
      name: headerParameterName(prototype, key, keyHeader) ?? keyHeader,
      required,
      description: `One unique value per operation, reused on retries (1-${MAX_KEY_LENGTH} printable characters; "key" or key). A repeat gets the first answer again with ${REPLAYED_HEADER}: true.`,
      schema: { type: 'string', minLength: 1, maxLength: MAX_KEY_LENGTH },
    })(prototype, key, descriptor!);
  }
}

/** `@nestjs/common`'s RouteParamtypes.HEADERS (stable since Nest 5). */
const HEADERS_ARG = 6;

/** The name a `@Headers(name)` parameter of the handler reads header `header` by (any case), if one does. */
function headerParameterName(prototype: object, key: string | symbol, header: string): string | undefined {
  const args = (Reflect.getMetadata(ROUTE_ARGS_METADATA, prototype.constructor, key) ?? {}) as Record<string, { data?: unknown }>;
  for (const [slot, arg] of Object.entries(args)) {
    if (Number(slot.split(':')[0]) === HEADERS_ARG && typeof arg.data === 'string' && arg.data.toLowerCase() === header.toLowerCase()) return arg.data;
  }
  return undefined;
}

/** Documents guarded routes in OpenAPI (`routeDocumenter`). */
export interface RouteDocumenter {
  /**
   * Documents the route `prototype[key]` as `metadata` guards it (undefined: unguarded) and
   * `digest` checks its body's digest (its `@ContentDigest()` options, undefined: none) under its
   * module's `defaults`: the key header where the key is that header, and every answer of the
   * guard and of `@ContentDigest()` per status, keeping the route's own responses. Documented
   * before under other options (another app of the process, another module), it is documented
   * again from its own metadata.
   */
  document(prototype: object, key: string, metadata: NoRepeatSubmitMetadata | undefined, defaults: Documenting['defaults'], digest?: ContentDigestOptions): void;
}

/**
 * What documents guarded routes, when `@nestjs/swagger` is installed (undefined otherwise).
 * Each module documents the routes it guards as it places the guard, with its own options,
 * while the application is created, before `SwaggerModule.createDocument()` reads the metadata:
 * documented once per process with the first module's options, a feature module's routes showed
 * the root's key header (a client sending it got 400), and a later app's the first app's (an
 * adversarial helper).
 */
export async function routeDocumenter(): Promise<RouteDocumenter | undefined> {
  let swagger: Documenting['swagger'];
  try {
    swagger = await import('@nestjs/swagger');
  } catch {
    return undefined;
  }
  const answers = everyAnswer();
  return { document: (prototype, key, metadata, defaults, digest) => documentRoute({ swagger, answers, defaults }, prototype, key, metadata, digest) };
}
