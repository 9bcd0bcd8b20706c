import type { ExecutionContext } from '@nestjs/common';
import { DEFAULTS } from './idempotency.constants.js';
import { IdempotencyConfigError } from './errors/idempotency.errors.js';
import { ERROR_FORMATS, type ErrorFormat } from './errors/problem-details.js';
import type {
  AnonymousPolicy,
  FailMode,
  IdempotencyModuleOptions,
  IdempotencyUserId,
  NoRepeatSubmitOptions,
  SaveStatuses,
} from './idempotency.options.js';
import type { HttpRequest } from './interceptors/http-request.js';
import type { SkippedMessageHandler } from './messages/skipped-message.js';
import { userObjectOf, type IdReading } from './interceptors/key-user.js';
import { resolveLocalCache } from './stores/local-cache/local-cache-options.js';

/** Whether the answer to a handler's error, of this status, is saved (only asked for 400-499). */
export type SavesStatus = (status: number) => boolean;

/** Module options with every default filled in; built once, in one place. */
export interface ResolvedIdempotencyOptions {
  keyPrefix: string;
  expireSeconds: number;
  leaseSeconds: number;
  maxHoldSeconds: number;
  /** The drain's bound at shutdown; undefined for none but each run's `maxHoldSeconds`. */
  shutdownWaitSeconds: number | undefined;
  failMode: FailMode;
  errorFormat: ErrorFormat;
  replayHeaders: readonly string[];
  ignoreFields: readonly string[];
  getUser: (ctx: ExecutionContext) => IdempotencyUserId | undefined;
  /** `'field'` for the default `getUser`, which gives the id a field of the user holds; `'template'` for the app's own. */
  userIdReading: IdReading;
  anonymous: AnonymousPolicy;
  maxResponseBytes: number;
  required: boolean;
  /** As the user spelled it (messages, docs); compared case-insensitively. */
  keyHeader: string;
  /** From `saveStatuses`; undefined when no answer to an error is saved. */
  savesStatus: SavesStatus | undefined;
  /** Where the request's user is (set once the app starts, see `UserLocation`). */
  userLocation: UserLocation;
  onSkippedMessage: SkippedMessageHandler | undefined;
}

/** Token of the resolved options. */
export const IDEMPOTENCY_RESOLVED_OPTIONS = Symbol('IDEMPOTENCY_RESOLVED_OPTIONS');

/**
 * The request properties that may hold the user, in the order they are read: any `property`
 * Passport was registered with (`PassportModule.register({ property })`, found when the app
 * starts: `passport-user.ts`), then `user`, which other guards (and Passport in a module that
 * registered no property) set.
 */
export interface UserLocation {
  properties: readonly string[];
}

/**
 * `request.user.id`, else `request.user.sub` (Nest's JWT recipe); an empty id counts as none. A
 * user that is a string or a number is its id. On Fastify, a user that Nest middleware set is on
 * the Node.js request (`request.raw.user`). Passport's other `property`, where one is registered, first.
 * The first argument by index: `switchToHttp()` would add closures on every call.
 */
const defaultGetUser = (ctx: ExecutionContext, location: UserLocation): string | number | bigint | undefined => {
  const user = userObjectOf(ctx.getArgByIndex<HttpRequest | undefined>(0), location.properties);
  if (typeof user === 'string' || typeof user === 'number') return user;
  if (user === null || typeof user !== 'object') return undefined;
  const { id, sub } = user as { id?: unknown; sub?: unknown };
  const chosen = id === undefined || id === null || id === '' ? sub : id;
  if (typeof chosen === 'string' || typeof chosen === 'number' || typeof chosen === 'bigint') return chosen;
  // An object, a Buffer or a list is no id: '' is refused as one (a user is set, so the call is
  // 500 USER_UNRESOLVED). A list passed on was read as the parts a getUser may give, and
  // `{ id: ['alice'] }` was alice (a session-21 helper).
  return chosen === undefined || chosen === null ? undefined : '';
};

/**
 * The options as given, refused when they are no object: a `forRootAsync()` factory written
 * `() => { store: ... }` (a block, not an object) returns undefined, which failed as a TypeError
 * reading `keyPrefix` (an adversarial helper).
 */
export function givenOptions(options: unknown): IdempotencyModuleOptions {
  if (typeof options === 'object' && options !== null && !Array.isArray(options)) return options as IdempotencyModuleOptions;
  throw new IdempotencyConfigError(
    `IdempotencyModule: the options are ${shown(options)}, not an object: a forRootAsync() factory (useFactory, or the create() ` +
      'of useClass / useExisting) must return them, e.g. useFactory: () => ({ store: ... }) (in parentheses: `() => { store: ... }` is a block that returns nothing)',
  );
}

export function resolveOptions(options: IdempotencyModuleOptions): ResolvedIdempotencyOptions {
  const userLocation: UserLocation = { properties: ['user'] };
  const resolved: ResolvedIdempotencyOptions = {
    keyPrefix: options.keyPrefix ?? DEFAULTS.keyPrefix,
    expireSeconds: options.expireSeconds ?? DEFAULTS.expireSeconds,
    leaseSeconds: options.leaseSeconds ?? DEFAULTS.leaseSeconds,
    maxHoldSeconds: options.maxHoldSeconds ?? DEFAULTS.maxHoldSeconds,
    shutdownWaitSeconds: options.shutdownWaitSeconds,
    failMode: options.failMode ?? DEFAULTS.failMode,
    errorFormat: options.errorFormat ?? DEFAULTS.errorFormat,
    replayHeaders: (options.replayHeaders ?? DEFAULTS.replayHeaders)
      .map((name) => name.toLowerCase())
      .filter((name) => name !== 'set-cookie'),
    ignoreFields: options.ignoreFields ?? [],
    getUser: options.getUser ?? ((ctx) => defaultGetUser(ctx, userLocation)),
    userIdReading: options.getUser === undefined ? 'field' : 'template',
    anonymous: options.anonymous ?? DEFAULTS.anonymous,
    maxResponseBytes: options.maxResponseBytes ?? DEFAULTS.maxResponseBytes,
    required: options.required ?? DEFAULTS.required,
    keyHeader: options.keyHeader ?? 'Idempotency-Key',
    savesStatus: savesStatus(options.saveStatuses),
    onSkippedMessage: options.onSkippedMessage,
    userLocation,
  };
  assertPositive('expireSeconds', resolved.expireSeconds);
  assertPositive('leaseSeconds', resolved.leaseSeconds);
  assertPositive('maxHoldSeconds', resolved.maxHoldSeconds);
  assertPositive('shutdownWaitSeconds', resolved.shutdownWaitSeconds);
  assertBytes(resolved.maxResponseBytes);
  assertSaveStatuses(options.saveStatuses);
  assertErrorFormat(options.errorFormat);
  assertShared(options);
  for (const name of ['getUser', 'onSkippedMessage', 'onEvent'] as const) assertFunction(name, options[name], 'IdempotencyModule');
  const { memoryMaxEntries, memoryMaxBytes } = options as { memoryMaxEntries?: unknown; memoryMaxBytes?: unknown };
  if (memoryMaxEntries !== undefined && !(Number.isInteger(memoryMaxEntries) && (memoryMaxEntries as number) >= 1)) {
    throw new IdempotencyConfigError(`IdempotencyModule: memoryMaxEntries must be a whole number, 1 or more (got ${shown(memoryMaxEntries)})`);
  }
  if (memoryMaxBytes !== undefined && !(Number.isSafeInteger(memoryMaxBytes) && (memoryMaxBytes as number) >= 1)) {
    throw new IdempotencyConfigError(`IdempotencyModule: memoryMaxBytes must be a whole number, 1 or more (got ${shown(memoryMaxBytes)})`);
  }
  resolveLocalCache(options.localCache);
  assertKnownOptions(options, MODULE_OPTIONS, 'IdempotencyModule', { interceptor: true, isGlobal: true });
  for (const extra of ['interceptor', 'isGlobal'] as const) {
    // forRoot() takes them off the options; a forRootAsync() factory cannot give them (Nest
    // builds the module, global or not, and its providers before any factory runs): isGlobal
    // there was ignored without a word (an adversarial helper).
    if (extra in options) {
      throw new IdempotencyConfigError(
        `IdempotencyModule: ${extra} goes beside useFactory / useClass in forRootAsync({ ${extra}, useFactory }), not in the options they return`,
      );
    }
  }
  if (resolved.anonymous !== 'client-key' && resolved.anonymous !== 'address') {
    throw new IdempotencyConfigError(`IdempotencyModule: anonymous must be 'client-key' or 'address' (got '${String(resolved.anonymous)}')`);
  }
  // A lone surrogate is sent as U+FFFD: 'p\uD800' and 'p\uDC00' were one prefix in Redis, and
  // the local cache never matched the invalidations of its keys (an adversarial helper: 5 of 5
  // forgotten records replayed on another instance).
  if (!resolved.keyPrefix || resolved.keyPrefix.includes(':') || /\p{Cs}/u.test(resolved.keyPrefix)) {
    throw new IdempotencyConfigError(
      `IdempotencyModule: keyPrefix must be non-empty and hold no ':' nor a lone surrogate (got ${JSON.stringify(resolved.keyPrefix)})`,
    );
  }
  return Object.freeze(resolved);
}

/** Every module option, as its type names them: a key not here is a misspelling. */
const MODULE_OPTIONS: { readonly [K in keyof Required<IdempotencyModuleOptions>]: true } = {
  store: true,
  keyHeader: true,
  keyPrefix: true,
  expireSeconds: true,
  leaseSeconds: true,
  maxHoldSeconds: true,
  shutdownWaitSeconds: true,
  getUser: true,
  anonymous: true,
  maxResponseBytes: true,
  required: true,
  failMode: true,
  errorFormat: true,
  onSkippedMessage: true,
  replayHeaders: true,
  ignoreFields: true,
  saveStatuses: true,
  memoryMaxEntries: true,
  memoryMaxBytes: true,
  localCache: true,
  metrics: true,
  onEvent: true,
};

/** Every `@NoRepeatSubmit()` option, as its type names them. */
export const ROUTE_OPTIONS: { readonly [K in keyof Required<NoRepeatSubmitOptions>]: true } = {
  expireSeconds: true,
  idempotentKey: true,
  useRequestFingerprint: true,
  leaseSeconds: true,
  maxHoldSeconds: true,
  failMode: true,
  errorFormat: true,
  ignoreFields: true,
  maxResponseBytes: true,
  keyHeader: true,
  required: true,
  saveStatuses: true,
  skipIf: true,
  methods: true,
  waitForResultMs: true,
};

/** What `forRootAsync()` takes beside the options: Nest's keys and the module's extras. */
const ASYNC_KEYS = { useFactory: true, useClass: true, useExisting: true, inject: true, imports: true, provideInjectionTokensFrom: true } as const;
const EXTRAS = { isGlobal: true, interceptor: true } as const;

/**
 * Refuses a key beside `useFactory` (or `useClass`, `useExisting`) that is neither Nest's nor
 * `isGlobal` / `interceptor`: Nest takes it for an extra, and the module drops it (an adversarial
 * helper: `failMode: 'closed'` there, in JavaScript, failed open).
 */
export function assertAsyncOptions(options: object): void {
  for (const key of Object.keys(options)) {
    if (Object.hasOwn(ASYNC_KEYS, key) || Object.hasOwn(EXTRAS, key)) continue;
    if (Object.hasOwn(MODULE_OPTIONS, key)) {
      throw new IdempotencyConfigError(`IdempotencyModule.forRootAsync: ${key} goes in the options useFactory returns, not beside it`);
    }
    const extra = closestOption(key, Object.keys(EXTRAS));
    const option = closestOption(key, Object.keys(MODULE_OPTIONS));
    throw new IdempotencyConfigError(
      `IdempotencyModule.forRootAsync: unknown option ${key} beside useFactory` +
        (extra ? ` (did you mean ${extra}?)` : option ? ` (did you mean ${option}, in the options it returns?)` : ''),
    );
  }
}

/** Options of the store's, given beside the module's. */
const STORE_OPTIONS = new Set(['redis', 'waitForReplicas']);

/**
 * Refuses an option key the options do not have, naming the one meant where one is close: where
 * TypeScript does not look (a `forRootAsync()` factory's object with one right key, options read
 * from the environment or typed `any`), `failmode: 'closed'` failed open without a word, and
 * `keyheader` asked for `Idempotency-Key` (an adversarial helper).
 */
export function assertKnownOptions(options: object, known: Readonly<Record<string, true>>, where: string, also: Readonly<Record<string, true>> = {}): void {
  for (const key of Object.keys(options)) {
    if (Object.hasOwn(known, key) || Object.hasOwn(also, key)) continue;
    const meant = STORE_OPTIONS.has(key) && Object.hasOwn(known, 'store') ? `store: { ${key} }` : closestOption(key, [...Object.keys(known), ...Object.keys(also)]);
    throw new IdempotencyConfigError(
      meant === undefined
        ? `${where}: unknown option ${key}; the options are ${Object.keys(known).join(', ')}`
        : `${where}: unknown option ${key} (did you mean ${meant}?)`,
    );
  }
}

/** The known option `key` is a slip of: the same but for case, or at most two letters apart. */
function closestOption(key: string, known: readonly string[]): string | undefined {
  const lower = key.toLowerCase();
  let best: { name: string; distance: number } | undefined;
  for (const name of known) {
    const distance = name.toLowerCase() === lower ? 0 : editDistance(lower, name.toLowerCase());
    if (distance <= 2 && (best === undefined || distance < best.distance)) best = { name, distance };
  }
  return best?.name;
}

/** Levenshtein distance (option names are short). */
function editDistance(a: string, b: string): number {
  let row = Array.from({ length: b.length + 1 }, (_, j) => j);
  for (let i = 1; i <= a.length; i++) {
    const next = [i];
    for (let j = 1; j <= b.length; j++) next[j] = Math.min(row[j]! + 1, next[j - 1]! + 1, row[j - 1]! + (a[i - 1] === b[j - 1] ? 0 : 1));
    row = next;
  }
  return row[b.length]!;
}

/**
 * The longest duration the guard times with a timer, in seconds: Node's longest (2^31 - 1 ms,
 * 24.8 days). A longer one fires at once (a `TimeoutOverflowWarning`): a 30-day lease aborted
 * every run's `@LeaseSignal()` within a millisecond (an adversarial helper).
 */
export const MAX_TIMED_SECONDS = 2_147_483;
/**
 * The longest retention, in seconds: 100 years. Redis refused every save of a retention past its
 * integers (`1e16` s: each duplicate ran again once the lease ended: an adversarial helper), and
 * PostgreSQL's timestamps end too.
 */
export const MAX_EXPIRE_SECONDS = 100 * 365 * 24 * 3600;

/** The most each of the seconds options may be (see `MAX_TIMED_SECONDS`, `MAX_EXPIRE_SECONDS`). */
const MAX_SECONDS: Record<string, number> = {
  expireSeconds: MAX_EXPIRE_SECONDS,
  leaseSeconds: MAX_TIMED_SECONDS,
  maxHoldSeconds: MAX_TIMED_SECONDS,
  shutdownWaitSeconds: MAX_TIMED_SECONDS,
};

export function assertPositive(name: string, value: number | undefined, where = 'IdempotencyModule'): void {
  if (value === undefined) return;
  const max = MAX_SECONDS[name] ?? Number.MAX_VALUE;
  if (!(typeof value === 'number' && Number.isFinite(value) && value > 0 && value <= max)) {
    throw new IdempotencyConfigError(
      `${where}: ${name} must be a positive number of seconds, at most ${max.toLocaleString('en')} (got ${shown(value)})`,
    );
  }
}

/**
 * The options the module and the decorator share whose wrong type would not fail loudly by
 * itself: a string from the environment (ConfigService) as `failMode: 'CLOSED'` failed open,
 * `ignoreFields: 'nonce'` ignored the fields n, o, c and e, `required: 'false'` required a key.
 */
export function assertShared(
  options: Pick<NoRepeatSubmitOptions, 'failMode' | 'ignoreFields' | 'required' | 'keyHeader'>,
  where = 'IdempotencyModule',
): void {
  const { failMode, ignoreFields, required, keyHeader } = options as Record<string, unknown>;
  // A header name is a token: 'Idempotency-Key ' (a trailing space from a .env file) matched no
  // header, and a route that does not require a key ran every call unguarded, saying nothing.
  if (keyHeader !== undefined && !(typeof keyHeader === 'string' && HEADER_NAME.test(keyHeader))) {
    throw new IdempotencyConfigError(`${where}: keyHeader must be a header name, e.g. 'Idempotency-Key' (got ${shown(keyHeader)})`);
  }
  if (failMode !== undefined && failMode !== 'open' && failMode !== 'closed') {
    throw new IdempotencyConfigError(`${where}: failMode must be 'open' or 'closed' (got ${shown(failMode)})`);
  }
  if (ignoreFields !== undefined && !(Array.isArray(ignoreFields) && ignoreFields.every((field) => typeof field === 'string'))) {
    throw new IdempotencyConfigError(`${where}: ignoreFields must be a list of field names, e.g. ['nonce'] (got ${shown(ignoreFields)})`);
  }
  // A path ('meta.nonce') was taken for a field of that name, matched nothing, and every retry
  // that changed the field got 422: the names are removed at any depth already.
  // So did one read from a list in the environment with its space (`'a, nonce'.split(',')`).
  const path = (ignoreFields as string[] | undefined)?.find((field) => /[.[\]]|^\/|^\s|\s$/.test(field));
  if (path !== undefined) {
    const name = path.trim().split(/[.[\]/'"]+/).filter(Boolean).pop() ?? path.trim();
    throw new IdempotencyConfigError(
      `${where}: ignoreFields names fields, not paths, without spaces around them: they are removed at any depth, so write ${shown(name)} for ${shown(path)}`,
    );
  }
  assertBoolean('required', required, where);
}

/** A value as an error message shows it: JSON where it has one (a BigInt has none). */
export function shown(value: unknown): string {
  // JSON writes NaN and Infinity as null.
  if (typeof value === 'number') return String(value);
  try {
    return JSON.stringify(value) ?? typeof value;
  } catch {
    return String(value);
  }
}

/** An HTTP field name (RFC 9110's token). */
const HEADER_NAME = /^[!#$%&'*+.^_`|~0-9A-Za-z-]+$/;

/** A function option given something else (a string from the environment: `getUser: 'user.id'`) fails at its first call, on every request. */
export function assertFunction(name: string, value: unknown, where: string): void {
  if (value !== undefined && typeof value !== 'function') {
    throw new IdempotencyConfigError(`${where}: ${name} must be a function (got ${shown(value)})`);
  }
}

export function assertBoolean(name: string, value: unknown, where: string): void {
  if (value !== undefined && typeof value !== 'boolean') {
    throw new IdempotencyConfigError(`${where}: ${name} must be true or false (got ${shown(value)})`);
  }
}

export function assertErrorFormat(value: unknown, where = 'IdempotencyModule'): void {
  if (value !== undefined && !ERROR_FORMATS.includes(value as ErrorFormat)) {
    throw new IdempotencyConfigError(`${where}: errorFormat must be ${ERROR_FORMATS.map((f) => `'${f}'`).join(' or ')} (got ${JSON.stringify(value)})`);
  }
}

export function assertBytes(value: number | undefined, where = 'IdempotencyModule'): void {
  if (value !== undefined && !(Number.isInteger(value) && value >= 0)) {
    throw new IdempotencyConfigError(`${where}: maxResponseBytes must be a whole number of bytes, 0 or more (got ${value})`);
  }
}

/**
 * `saveStatuses` as a test of a status: undefined when it saves none (unset, or an empty list).
 * A function is asked only about 4xx statuses; a 5xx is never saved.
 */
export function savesStatus(saveStatuses: SaveStatuses | undefined): SavesStatus | undefined {
  if (typeof saveStatuses === 'function') return (status) => status >= 400 && status < 500 && Boolean(saveStatuses(status));
  if (!saveStatuses?.length) return undefined;
  const saved = new Set(saveStatuses);
  return (status) => saved.has(status);
}

export function assertSaveStatuses(value: unknown, where = 'IdempotencyModule'): void {
  if (value === undefined || typeof value === 'function') return;
  const statuses: unknown[] | undefined = Array.isArray(value) ? value : undefined;
  const bad = statuses?.filter((status) => !(Number.isInteger(status) && (status as number) >= 400 && (status as number) < 500));
  if (!statuses || bad!.length > 0) {
    throw new IdempotencyConfigError(
      `${where}: saveStatuses must be a list of 4xx statuses or a function of the status (got ${statuses ? bad!.map(String).join(', ') : String(value)}); 5xx answers are never saved`,
    );
  }
}
