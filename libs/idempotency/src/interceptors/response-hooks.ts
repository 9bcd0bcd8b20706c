import { OutgoingMessage, type ServerResponse } from 'node:http';

type Args = unknown[];

/** What the guard does with a call of a response's writing methods (`res` is the response). */
export interface ResponseHook {
  writeHead(res: ServerResponse, args: Args): ServerResponse;
  write(res: ServerResponse, args: Args): boolean;
  end(res: ServerResponse, args: Args): ServerResponse;
  /** What the response says of itself while the hook holds its bytes; undefined: what Node says. */
  readonly reported?: { readonly headersSent: boolean; readonly writableEnded: boolean };
}

/** The writing methods as they were before a hook: what it calls to let a call through. */
export interface Through {
  writeHead: ServerResponse['writeHead'];
  write: ServerResponse['write'];
  end: ServerResponse['end'];
}

const HOOK = Symbol('nestjs-idempotency.responseHook');
type Hooked = ServerResponse & { [HOOK]?: ResponseHook };
/** The hook the shared own methods (`ownMethods`) of a response built by its class call. */
const OWN_HOOK = Symbol('nestjs-idempotency.ownResponseHook');
type OwnHooked = ServerResponse & { [OWN_HOOK]?: ResponseHook };

const derivedPrototypes = new WeakMap<object, object>();

/**
 * Puts `hook` on the response's `writeHead`, `write` and `end`, and returns the methods it stands
 * in front of. See `showReports` for `headersSent` and `writableEnded`.
 *
 * Where it goes depends on how the response was built, because each property added to an object
 * whose prototype was swapped after it was built (Express does so on every response, to its
 * app's `response`) gives that object a hidden class of its own: V8 shares no transitions from a
 * prototype-swapped map. Measured on Express: seven properties added per response cost ~20 µs of
 * CPU a request, the collector's share included (bench/README.md). So:
 * - a response built by its class (Node's, Fastify's `reply.raw`) takes the hook and three
 *   methods as its own properties, along V8's shared transitions. The methods are the same three
 *   functions for every response, which find the hook on it: a closure of its own on each response
 *   made the collector keep what the hook holds past young-generation collections (on Fastify,
 *   ~125 KB promoted per scavenge on replays, against none with shared methods; bench/README.md);
 * - a prototype-swapped one (Express) takes one property, the hook, and a prototype derived once
 *   from its own, whose methods find the hook;
 * - a response that already has methods of its own (a compression middleware's) or a hook (a
 *   second run after an outer `retry()`) takes closures as its own properties, in front of those;
 * - a response handed to code that may swap its prototype again (`ownProperties`: a `@Res()`
 *   handler may pass it to another Express app, which sets that app's `response` as its
 *   prototype, and a hook on the old prototype would no longer see the answer) takes them as its
 *   own properties too.
 */
export function hookResponse(raw: ServerResponse, hook: ResponseHook, ownProperties = false): Through {
  const response = raw as Hooked;
  const through: Through = { writeHead: raw.writeHead, write: raw.write, end: raw.end };
  const prototype = Object.getPrototypeOf(raw) as object | null;
  if (!(HOOK in raw) && !(OWN_HOOK in raw) && !hasOwnMethod(raw)) {
    if (!ownProperties && prototype !== null && swapped(raw, prototype)) {
      response[HOOK] = hook;
      Object.setPrototypeOf(raw, derivedFrom(prototype));
      return through;
    }
    (raw as OwnHooked)[OWN_HOOK] = hook;
    raw.writeHead = ownMethods.writeHead;
    raw.write = ownMethods.write;
    raw.end = ownMethods.end;
    return through;
  }
  raw.writeHead = function (this: ServerResponse, ...args: Args) {
    return hook.writeHead(this, args);
  } as ServerResponse['writeHead'];
  raw.write = function (this: ServerResponse, ...args: Args) {
    return hook.write(this, args);
  } as ServerResponse['write'];
  raw.end = function (this: ServerResponse, ...args: Args) {
    return hook.end(this, args);
  } as ServerResponse['end'];
  return through;
}

/**
 * From now on the response's `headersSent` and `writableEnded` answer from `hook.reported` (when
 * it says true), else from Node. A hook on the response's prototype has them there already; a
 * hook of its own properties puts two accessors on the response now, not before (until then,
 * the app reads Node's own getters, at their speed).
 */
export function showReports(raw: ServerResponse, hook: ResponseHook): void {
  if ((raw as Hooked)[HOOK] === hook) return;
  // Node refuses header changes itself once its head went out (Fastify sends it before the body).
  const headHeld = !raw.headersSent;
  (raw as OwnReporting)[OWN_REPORTER] = hook;
  // Two defineProperty calls: defineProperties reads its descriptor map anew each time, and
  // cost 0.43 µs a response against 0.17 µs for these.
  Object.defineProperty(raw, 'headersSent', ownReports.headersSent);
  Object.defineProperty(raw, 'writableEnded', ownReports.writableEnded);
  if (!headHeld) return;
  // Assigned one by one, as `hookResponse` puts on its methods: Object.defineProperties of the
  // three cost ~0.9 µs a response, Object.assign ~0.35, these assignments ~0.06 (Node 20).
  const methods = ownHeaderMethods(raw as unknown as HeaderMethods);
  const target = raw as unknown as HeaderMethods;
  target.setHeader = methods.setHeader!;
  target.removeHeader = methods.removeHeader!;
  if (methods.appendHeader) target.appendHeader = methods.appendHeader;
}

type HeaderMethods = Pick<ServerResponse, 'setHeader' | 'removeHeader'> & { appendHeader?: (...args: Args) => unknown };
type HeaderMethodName = keyof HeaderMethods;
const HEADER_METHODS = ['setHeader', 'removeHeader', 'appendHeader'] as const;
/** The method a refusing header method lets a call through to, found at the call. */
type MethodOf = (response: ServerResponse, name: HeaderMethodName) => (...args: Args) => unknown;

/**
 * Header methods refusing as Node does once the head is sent while the hook found by `hookOf`
 * reports it so: the head it holds went out, as far as the app can tell. Let through, a second
 * answer's headers went with the first answer's bytes (Express's `res.send(a)` then
 * `res.json(b)`: the first client got `a` under `b`'s `Content-Length`, a stalled or unparsable
 * answer; an adversarial helper), where Node refuses them and the first answer goes out whole.
 * Otherwise each call goes to what `methodOf` finds at that call (an APM agent may patch Node's
 * methods after the hook was put on). `appendHeader` only where `from` has one (Node 18.15+).
 */
function headerMethods(from: HeaderMethods, hookOf: (response: ServerResponse) => ResponseHook | undefined, methodOf: MethodOf): Partial<HeaderMethods> {
  const refusing = (name: HeaderMethodName, verb: string) =>
    function (this: ServerResponse, ...args: Args) {
      if (hookOf(this)?.reported?.headersSent) throw headersSentError(verb);
      return methodOf(this, name).apply(this, args);
    };
  const methods = { setHeader: refusing('setHeader', 'set'), removeHeader: refusing('removeHeader', 'remove') } as Partial<HeaderMethods>;
  if (typeof from.appendHeader === 'function') methods.appendHeader = refusing('appendHeader', 'append');
  return methods;
}

const ownReporter = (response: ServerResponse) => (response as OwnReporting)[OWN_REPORTER];

/**
 * The refusing header methods (`headerMethods`) of a response whose hook is its own property.
 * One map, the same functions, for every response whose header methods are its prototype's
 * (Node's, on Fastify's `reply.raw`): each call goes to what the prototype has then. A response
 * with header methods of its own (a middleware put them on) keeps those, in closures of its own.
 */
function ownHeaderMethods(raw: HeaderMethods): Partial<HeaderMethods> {
  if (HEADER_METHODS.some((name) => Object.hasOwn(raw, name))) {
    const own = { setHeader: raw.setHeader, removeHeader: raw.removeHeader, appendHeader: raw.appendHeader } as Record<HeaderMethodName, (...args: Args) => unknown>;
    return headerMethods(raw, ownReporter, (_response, name) => own[name]);
  }
  const withAppend = typeof raw.appendHeader === 'function' ? 1 : 0;
  return (sharedHeaderMethods[withAppend] ??= headerMethods(raw, ownReporter, prototypeMethod));
}

const sharedHeaderMethods: [Partial<HeaderMethods>?, Partial<HeaderMethods>?] = [];

function prototypeMethod(response: ServerResponse, name: HeaderMethodName): (...args: Args) => unknown {
  return Reflect.get(Object.getPrototypeOf(response) as object, name, response) as (...args: Args) => unknown;
}

const NODE_HEADER_READS = {
  getHeader: OutgoingMessage.prototype.getHeader,
  hasHeader: OutgoingMessage.prototype.hasHeader,
  getHeaderNames: OutgoingMessage.prototype.getHeaderNames,
};

/**
 * The names of the headers set on a response, lower case, read at once; undefined where the
 * response reads its headers otherwise than Node's `OutgoingMessage` does (an agent's override
 * of `getHeader` or `hasHeader` may answer for a header Node does not hold: an adversarial helper;
 * HTTP/2's compatibility response), and the caller asks it name by name. Node's `getHeader` and
 * `hasHeader` lower-case the name they are given: asked for each of a list of names, most of
 * them absent, they cost ~250 instructions a name (callgrind, session 37: ~2,000 a first
 * request, ~2,500 a replay).
 */
export function namesSetOn(raw: ServerResponse): readonly string[] | undefined {
  const { getHeader, hasHeader, getHeaderNames } = raw;
  const nodes = getHeader === NODE_HEADER_READS.getHeader && hasHeader === NODE_HEADER_READS.hasHeader && getHeaderNames === NODE_HEADER_READS.getHeaderNames;
  return nodes ? raw.getHeaderNames() : undefined;
}

/** Node's error for a head changed after it was sent (`ERR_HTTP_HEADERS_SENT`). */
export function headersSentError(verb: string): Error {
  return Object.assign(new Error(`Cannot ${verb} headers after they are sent to the client`), { code: 'ERR_HTTP_HEADERS_SENT' });
}

/** Set on a response whose late header changes are dropped (`dropLateHeaders`). */
const DROPS_LATE_HEADERS = Symbol('nestjs-idempotency.dropsLateHeaders');

/**
 * From now on, once the response's head has gone out, its `setHeader`, `appendHeader` and
 * `removeHeader` do nothing instead of throwing Node's `ERR_HTTP_HEADERS_SENT`, as Fastify's
 * `reply.header()` does: another answer went out while the handler ran (an outer timeout's), and
 * a header the handler sets after its work (`@Res({ passthrough: true })`, a cookie) can reach
 * nobody. Thrown, it failed a handler that had done its work, the key was released, and every
 * timed-out retry ran it again (an adversarial helper: 10 of 10 keys ran 4 times). Telling
 * such errors apart by their code instead kept the key of handlers that failed for real with
 * one of those codes, and missed a handler that wrapped the error. Before the head goes out
 * (the other answer's own headers), they are Node's.
 */
export function dropLateHeaders(raw: ServerResponse): void {
  if (Object.hasOwn(raw, DROPS_LATE_HEADERS)) return;
  const dropping = (name: 'setHeader' | 'appendHeader' | 'removeHeader'): PropertyDescriptor | undefined => {
    const method = (raw as unknown as Record<string, unknown>)[name];
    if (typeof method !== 'function') return undefined;
    return {
      configurable: true,
      writable: true,
      value(this: ServerResponse, ...args: Args) {
        return this.headersSent ? (name === 'removeHeader' ? undefined : this) : method.apply(this, args);
      },
    };
  };
  const methods: PropertyDescriptorMap = { [DROPS_LATE_HEADERS]: { value: true } };
  for (const name of ['setHeader', 'appendHeader', 'removeHeader'] as const) {
    const descriptor = dropping(name);
    if (descriptor) methods[name] = descriptor;
  }
  Object.defineProperties(raw, methods);
}

/**
 * The methods a response built by its class takes as its own: one function each for every
 * response, calling the hook on the response they are called on (else, called on another
 * object, what its prototype has).
 */
const ownMethods = {
  writeHead(this: OwnHooked, ...args: Args): ServerResponse {
    const hook = this[OWN_HOOK];
    return hook ? hook.writeHead(this, args) : (inheritedMethod(this, 'writeHead') as (...a: Args) => ServerResponse).apply(this, args);
  },
  write(this: OwnHooked, ...args: Args): boolean {
    const hook = this[OWN_HOOK];
    return hook ? hook.write(this, args) : (inheritedMethod(this, 'write') as (...a: Args) => boolean).apply(this, args);
  },
  end(this: OwnHooked, ...args: Args): ServerResponse {
    const hook = this[OWN_HOOK];
    return hook ? hook.end(this, args) : (inheritedMethod(this, 'end') as (...a: Args) => ServerResponse).apply(this, args);
  },
} as Through;

function inheritedMethod(target: object, name: keyof Through): unknown {
  return Reflect.get(Object.getPrototypeOf(target) as object, name, target);
}

/** A prototype other than the one its class gives: set after the object was built. */
function swapped(raw: ServerResponse, prototype: object): boolean {
  return typeof raw.constructor !== 'function' || prototype !== raw.constructor.prototype;
}

function hasOwnMethod(raw: ServerResponse): boolean {
  return Object.hasOwn(raw, 'writeHead') || Object.hasOwn(raw, 'write') || Object.hasOwn(raw, 'end');
}

/**
 * The prototype hooked responses of `parent` get: its methods call the response's hook, else
 * (no hook) the parent's. Made once per parent (an Express app's `response`).
 */
function derivedFrom(parent: object): object {
  let derived = derivedPrototypes.get(parent);
  if (derived !== undefined) return derived;
  const inherited = parent as Through;
  const headersSent = getterOf(parent, 'headersSent');
  const writableEnded = getterOf(parent, 'writableEnded');
  derived = Object.create(parent, {
    writeHead: {
      configurable: true,
      writable: true,
      value(this: Hooked, ...args: Args) {
        const hook = this[HOOK];
        return hook ? hook.writeHead(this, args) : (inherited.writeHead as (...a: Args) => ServerResponse).apply(this, args);
      },
    },
    write: {
      configurable: true,
      writable: true,
      value(this: Hooked, ...args: Args) {
        const hook = this[HOOK];
        return hook ? hook.write(this, args) : (inherited.write as (...a: Args) => boolean).apply(this, args);
      },
    },
    end: {
      configurable: true,
      writable: true,
      value(this: Hooked, ...args: Args) {
        const hook = this[HOOK];
        return hook ? hook.end(this, args) : (inherited.end as (...a: Args) => ServerResponse).apply(this, args);
      },
    },
    ...methodDescriptors(headerMethods(parent as HeaderMethods, (response) => (response as Hooked)[HOOK], (_response, name) => (parent as HeaderMethods)[name] as (...a: Args) => unknown)),
    headersSent: {
      configurable: true,
      get(this: Hooked): boolean {
        return this[HOOK]?.reported?.headersSent || headersSent.call(this);
      },
    },
    writableEnded: {
      configurable: true,
      get(this: Hooked): boolean {
        return this[HOOK]?.reported?.writableEnded || writableEnded.call(this);
      },
    },
  }) as object;
  derivedPrototypes.set(parent, derived);
  return derived;
}

/** Methods as a prototype's: configurable, writable, not enumerable. */
function methodDescriptors(methods: object): PropertyDescriptorMap {
  return Object.fromEntries(Object.entries(methods).map(([name, value]) => [name, { configurable: true, writable: true, value }]));
}

/**
 * The getter `name` has on `prototype` or up its chain (Node's `OutgoingMessage` has both), found
 * once; where it is not a getter, a plain read through the chain.
 */
function getterOf(prototype: object, name: string): (this: object) => boolean {
  for (let at: object | null = prototype; at !== null; at = Object.getPrototypeOf(at) as object | null) {
    const descriptor = Object.getOwnPropertyDescriptor(at, name);
    if (descriptor?.get) return descriptor.get as (this: object) => boolean;
    if (descriptor) break;
  }
  return function (this: object) {
    return Reflect.get(prototype, name, this) as boolean;
  };
}

/**
 * The hook whose reports a response with own methods shows. The accessors are the same two
 * functions for every response, so that such responses keep sharing a shape.
 */
const OWN_REPORTER = Symbol('nestjs-idempotency.responseReporter');
type OwnReporting = ServerResponse & { [OWN_REPORTER]?: ResponseHook };
const ownReports = {
  headersSent: {
    configurable: true,
    get(this: OwnReporting): boolean {
      return this[OWN_REPORTER]?.reported?.headersSent || (Reflect.get(Object.getPrototypeOf(this) as object, 'headersSent', this) as boolean);
    },
  },
  writableEnded: {
    configurable: true,
    get(this: OwnReporting): boolean {
      return this[OWN_REPORTER]?.reported?.writableEnded || (Reflect.get(Object.getPrototypeOf(this) as object, 'writableEnded', this) as boolean);
    },
  },
} satisfies PropertyDescriptorMap;
