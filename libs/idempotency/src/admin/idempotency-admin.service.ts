import { Inject, Injectable, Logger } from '@nestjs/common';
import { IdempotencyError, IdempotencyNotARecordError } from '../errors/idempotency.errors.js';
import { IDEMPOTENCY_RESOLVED_OPTIONS, type ResolvedIdempotencyOptions } from '../idempotency.config.js';
import { userOfId } from '../interceptors/key-user.js';
import { validateKey } from '../keys/idempotency-key.js';
import { buildStorageKey, type KeyUser } from '../keys/storage-key.js';
import { IdempotencyStore, type ForgetResult, type SavedResponse, type StoredRecord, type UnreplayableReason } from '../stores/idempotency-store.js';

/**
 * Whose record, as the guard keys it: a user id as `getUser` gives it (a string, a number, or
 * the parts of one, `['t1', 'u-42']`; `''` for message handlers, which have no user), `{ ip }` for
 * an anonymous caller under `anonymous: 'address'`, `{ anonymous: true }` for the shared
 * anonymous namespace.
 */
export type IdempotencyRecordUser = string | number | bigint | readonly (string | number | bigint)[] | KeyUser;

/**
 * One record: by what the guard keys it on (`user`, `handler` as `Controller.method`, the client
 * `key`: the `Idempotency-Key` header's value or the body field an `idempotentKey` reads; or the
 * request's `fingerprint`, for a call without a key on a `useRequestFingerprint` route), or by its
 * storage key as it stands, e.g. `'no_repeat:42:OrdersController.create:A-1'` (a string, or
 * `{ storageKey }`).
 */
export type IdempotencyRecordRef =
  | { user: IdempotencyRecordUser; handler: string; key: string }
  | { user: IdempotencyRecordUser; handler: string; fingerprint: string }
  | { storageKey: string }
  | string;

/** What `IdempotencyAdmin.inspect` found under a storage key. Times are by this process's clock. */
export type IdempotencyInspection =
  | { storageKey: string; state: 'absent' }
  /** The key holds something else, not the guard's (Redis: a value or a hash the app wrote there). */
  | { storageKey: string; state: 'not_a_record' }
  | {
      storageKey: string;
      /** A request holds the key: its handler is running (or its process died, until the lease ends). */
      state: 'in_progress';
      /** Milliseconds until the lease ends, unless the holder renews it (it does while its handler runs). */
      leaseLeftMs: number;
      leaseExpiresAt: Date;
      /**
       * Whether the key was claimed with a request fingerprint (duplicates must match it, else 422).
       * Not the fingerprint itself: a SHA-256 of the request, it told a small body to whoever
       * tried candidates (an adversarial helper: an amount found in 1.7 s).
       */
      fingerprinted: boolean;
    }
  | {
      storageKey: string;
      /** The handler ran to success (or a 4xx in `saveStatuses`): duplicates get this answer. */
      state: 'completed';
      statusCode: number;
      /** False when duplicates get 409 `IDEMPOTENCY_RESPONSE_NOT_REPLAYABLE` instead (see `unreplayable`). */
      replayable: boolean;
      unreplayable?: UnreplayableReason;
      /** Size of the saved body, in bytes (0 without a body). */
      bodyBytes: number;
      /** Names of the saved response headers (`replayHeaders`); their values and the body are not shown. */
      headerNames: string[];
      /** Milliseconds of retention left; null when the record has no expiry. */
      retentionLeftMs: number | null;
      expiresAt: Date | null;
      /** Whether the key was claimed with a request fingerprint (see `in_progress`). */
      fingerprinted: boolean;
    };

/** What `IdempotencyAdmin.forget` did, and to which storage key. */
export type IdempotencyForgetResult = ForgetResult & { storageKey: string };

/**
 * The operator's view of the guard's records, for support tools: did this request go through,
 * and unblock a client by forgetting its answer. Provided and exported by `IdempotencyModule`;
 * inject it in your own admin controller, behind your own authorization: it reads and deletes any
 * user's records.
 */
@Injectable()
export class IdempotencyAdmin {
  private readonly logger = new Logger('IdempotencyAdmin');

  constructor(
    private readonly store: IdempotencyStore,
    @Inject(IDEMPOTENCY_RESOLVED_OPTIONS) private readonly options: ResolvedIdempotencyOptions,
  ) {}

  /**
   * The storage key of a record, built as the guard builds it: `<keyPrefix>:<user>:<handler>:<key>`,
   * each segment percent-encoded. A storage key given as it stands is returned unchanged.
   */
  storageKeyOf(ref: IdempotencyRecordRef): string {
    if (typeof ref === 'string') return ref;
    if ('storageKey' in ref) return ref.storageKey;
    return buildStorageKey({ prefix: this.options.keyPrefix, user: keyUser(ref.user), handler: ref.handler, key: keyOf(ref) });
  }

  /**
   * Describes the record without changing it. An unknown or expired key is `absent`, and a key
   * that holds something else (in a keyspace the app shares, as Redis) is `not_a_record`: values,
   * not errors. Throws only when the store cannot answer.
   */
  async inspect(ref: IdempotencyRecordRef): Promise<IdempotencyInspection> {
    const storageKey = this.storageKeyOf(ref);
    let record: StoredRecord | undefined;
    try {
      record = await this.store.get(storageKey);
    } catch (error) {
      if (error instanceof IdempotencyNotARecordError) return { storageKey, state: 'not_a_record' };
      throw error;
    }
    if (!record) return { storageKey, state: 'absent' };
    return describeRecord(storageKey, record, Date.now());
  }

  /**
   * Deletes a COMPLETED record, so that the next request with its key runs the handler again.
   * A request in progress is refused (`{ forgotten: false, reason: 'in_progress' }`) and keeps
   * its claim: deleting it would let a duplicate run beside the live handler. Ask again once it
   * completed, or once its lease ran out (`inspect` says when). No record: `reason: 'absent'`.
   * A key that holds something else: `reason: 'not_a_record'`, and it is left as it was.
   * One atomic store call: a request that claims the key meanwhile is never deleted.
   */
  async forget(ref: IdempotencyRecordRef): Promise<IdempotencyForgetResult> {
    const storageKey = this.storageKeyOf(ref);
    const result = await this.store.forget(storageKey);
    if (result.forgotten) {
      this.logger.log(`forgot the completed record ${storageKey}: the next request with its key runs the handler again`);
    }
    return { ...result, storageKey };
  }
}

const FINGERPRINT = /^[0-9a-f]{64}$/;

/**
 * The record's key as the guard keys it: a client key it would accept (a number as its text, as
 * the guard keys a `#body` number), or a fingerprint (a SHA-256 in hex). An empty, missing or
 * unusable one named no record the guard keeps, and both given took the fingerprint in silence
 * (an adversarial helper).
 */
function keyOf(ref: { key?: unknown; fingerprint?: unknown }): string | { fingerprint: string } {
  const { key, fingerprint } = ref;
  if ('fingerprint' in ref) {
    if ('key' in ref) throw new IdempotencyError('IdempotencyAdmin: give a record its key or its fingerprint, not both');
    if (typeof fingerprint !== 'string' || !FINGERPRINT.test(fingerprint)) {
      throw new IdempotencyError(`IdempotencyAdmin: ${String(fingerprint)} is not a request fingerprint (64 hexadecimal digits)`);
    }
    return { fingerprint };
  }
  const text = typeof key === 'string' ? key : (typeof key === 'number' && Number.isFinite(key)) || typeof key === 'bigint' ? String(key) : undefined;
  const invalid = text === undefined ? 'it is not a text' : validateKey(text);
  if (invalid !== undefined) throw new IdempotencyError(`IdempotencyAdmin: ${String(key)} is not a key the guard keys by: ${invalid}`);
  return text!;
}

/** The user segment, as the guard makes it from a user id (`key-user.ts`). */
function keyUser(user: IdempotencyRecordUser): KeyUser {
  if (typeof user === 'object' && user !== null && !Array.isArray(user)) {
    // `{ parts }` as the guard makes it: two or more non-empty texts (one part is a plain id).
    const parts = (user as { parts?: unknown }).parts;
    if (parts === undefined) return user as KeyUser;
    const keyed = Array.isArray(parts) && parts.length > 1 ? userOfId(parts, undefined, 'plain') : undefined;
    if (keyed === undefined) throw new IdempotencyError(`IdempotencyAdmin: ${JSON.stringify(user)} is not a user the guard keys by`);
    return keyed;
  }
  // '' is a message's user (they have none); an HTTP user id is never empty.
  const keyed = user === '' ? { id: '' } : userOfId(user, undefined, 'plain');
  if (keyed === undefined) throw new IdempotencyError(`IdempotencyAdmin: ${String(user)} is not a user id the guard keys by`);
  return keyed;
}

function describeRecord(storageKey: string, record: StoredRecord, now: number): IdempotencyInspection {
  const { ttlMs } = record;
  const fingerprinted = record.fingerprint !== '';
  if (record.state === 'processing') {
    return { storageKey, state: 'in_progress', leaseLeftMs: ttlMs, leaseExpiresAt: new Date(now + ttlMs), fingerprinted };
  }
  const response = record.response!;
  const expires = ttlMs >= 0;
  const inspection: IdempotencyInspection = {
    storageKey,
    state: 'completed',
    statusCode: response.statusCode,
    replayable: response.unreplayable === undefined,
    bodyBytes: bodyBytes(response),
    headerNames: Object.keys(response.headers),
    retentionLeftMs: expires ? ttlMs : null,
    expiresAt: expires ? new Date(now + ttlMs) : null,
    fingerprinted,
  };
  if (response.unreplayable !== undefined) inspection.unreplayable = response.unreplayable;
  return inspection;
}

function bodyBytes({ body, encoding }: SavedResponse): number {
  if (body === undefined) return 0;
  return encoding === 'base64' ? Buffer.from(body, 'base64').length : Buffer.byteLength(body, 'utf8');
}
