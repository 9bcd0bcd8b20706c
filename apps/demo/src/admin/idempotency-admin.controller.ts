import { BadRequestException, Controller, createParamDecorator, Delete, Get, Param, Res, ServiceUnavailableException, UseGuards, type ExecutionContext } from '@nestjs/common';
import { ApiExcludeController } from '@nestjs/swagger';
import {
  IdempotencyAdmin,
  IdempotencyStoreError,
  MAX_KEY_LENGTH,
  type IdempotencyForgetResult,
  type IdempotencyInspection,
  type IdempotencyRecordRef,
} from 'nestjs-idempotency';
import { USER_ID } from '../demo-user.guard.js';
import type { StatusSetter } from '../http-response.js';
import { AdminTokenGuard } from './admin-token.guard.js';

/** `Controller.method`, as the guard names a handler. */
const HANDLER = /^[A-Za-z_$][\w$]*\.[A-Za-z_$][\w$]*$/;
/** Longer than any storage key the demo makes (prefix, a 64-character user, a handler, 255 characters of key percent-encoded). */
const MAX_STORAGE_KEY_LENGTH = 4096;

/** A forget's answer: 200 forgotten; 409 a request holds the key, or the key holds no record; 404 nothing under the key. */
type ForgetAnswer = IdempotencyForgetResult & { code?: string; message?: string };
/** An inspection's answer: 200, or 409 when the key holds something that is no idempotency record. */
type InspectAnswer = IdempotencyInspection & { code?: string; message?: string };

/** 409 `IDEMPOTENCY_NOT_A_RECORD`: the storage key holds the app's own data (Redis is shared), left as it is. */
const NOT_A_RECORD = {
  code: 'IDEMPOTENCY_NOT_A_RECORD',
  message: 'This key holds something that is no idempotency record (other data in the same Redis): nothing was read or deleted. Check the storage key.',
} as const;

type Query = Record<string, unknown>;

/** The request's query as the adapter parsed it (a custom decorator: the global ValidationPipe leaves it as it is). */
const RawQuery = createParamDecorator((_data: unknown, ctx: ExecutionContext): Query => ({ ...(ctx.switchToHttp().getRequest<{ query?: Query }>().query ?? {}) }));

/**
 * Support's view of the idempotency records (`IdempotencyAdmin`), behind the admin token:
 * "did this order go through?", and forgetting a completed record so that the client's next
 * request with its key runs again. A record is named by the guard's parts (handler, key, and
 * `?user=` the X-User-Id it was made under; no `user`: an anonymous caller), or by its storage
 * key (`?storageKey=`), as logs show it.
 */
@ApiExcludeController()
@Controller('admin/idempotency')
@UseGuards(AdminTokenGuard)
export class IdempotencyAdminController {
  constructor(private readonly admin: IdempotencyAdmin) {}

  /**
   * 200 with the record's description: `absent`, `in_progress` (lease), or `completed` (status,
   * size, replayable); 409 `IDEMPOTENCY_NOT_A_RECORD` when the key holds something else.
   */
  @Get(':handler/:key')
  async inspect(
    @Param('handler') handler: string,
    @Param('key') key: string,
    @Res({ passthrough: true }) res: StatusSetter,
    @RawQuery() query: Query,
  ): Promise<InspectAnswer> {
    return described(res, await storeAnswer(this.admin.inspect(recordRef(handler, key, only(query, 'user')))));
  }

  @Delete(':handler/:key')
  async forget(
    @Param('handler') handler: string,
    @Param('key') key: string,
    @Res({ passthrough: true }) res: StatusSetter,
    @RawQuery() query: Query,
  ): Promise<ForgetAnswer> {
    return answer(res, await storeAnswer(this.admin.forget(recordRef(handler, key, only(query, 'user')))));
  }

  @Get()
  async inspectStorageKey(@Res({ passthrough: true }) res: StatusSetter, @RawQuery() query: Query): Promise<InspectAnswer> {
    return described(res, await storeAnswer(this.admin.inspect({ storageKey: checkedStorageKey(only(query, 'storageKey')) })));
  }

  @Delete()
  async forgetStorageKey(@Res({ passthrough: true }) res: StatusSetter, @RawQuery() query: Query): Promise<ForgetAnswer> {
    return answer(res, await storeAnswer(this.admin.forget({ storageKey: checkedStorageKey(only(query, 'storageKey')) })));
  }
}


/**
 * The one parameter a route takes, once, or undefined; anything else in the query is refused
 * (400). A typo (`?userId=alice`) read as no user forgot the anonymous callers' record of the key,
 * and `?storageKey=a&storageKey=b` forgot "a,b" (an adversarial helper): a route that deletes
 * reads only what it was sent.
 */
function only(query: Query, name: string): string | undefined {
  const others = Object.keys(query).filter((given) => given !== name);
  if (others.length > 0) throw invalid([`this route takes only ?${name}= (got ${others.map((other) => `?${other}=`).join(', ')})`]);
  const value = query[name];
  if (value !== undefined && typeof value !== 'string') throw invalid([`${name} must be given once`]);
  return value;
}

/**
 * The store's answer; 503 `IDEMPOTENCY_STORE_UNAVAILABLE` when it gave none (500 before, with a
 * stack trace; a forget that timed out may still have landed: an adversarial helper saw the record
 * gone once a pause ended).
 */
async function storeAnswer<T>(call: Promise<T>): Promise<T> {
  try {
    return await call;
  } catch (error) {
    if (!(error instanceof IdempotencyStoreError)) throw error;
    throw new ServiceUnavailableException({
      statusCode: 503,
      error: 'Service Unavailable',
      code: 'IDEMPOTENCY_STORE_UNAVAILABLE',
      message: 'The idempotency store did not answer: what was asked may or may not have happened. Inspect the record once the store is back.',
    });
  }
}

function recordRef(handler: string, key: string, user: string | undefined): IdempotencyRecordRef {
  const problems = [
    HANDLER.test(handler) ? undefined : 'handler must be Controller.method, e.g. OrdersController.create',
    // Counted as the guard counts a key: in Unicode code points, so 255 astral characters pass.
    key.length >= 1 && [...key].length <= MAX_KEY_LENGTH ? undefined : `key must be 1 to ${MAX_KEY_LENGTH} characters`,
    user === undefined || (typeof user === 'string' && USER_ID.test(user)) ? undefined : 'user must be an X-User-Id: 1 to 64 characters of letters, digits, "_", "." or "-"',
  ].filter((problem): problem is string => problem !== undefined);
  if (problems.length > 0) throw invalid(problems);
  return { user: user ?? { anonymous: true }, handler, key };
}

function checkedStorageKey(storageKey: string | undefined): string {
  if (typeof storageKey === 'string' && storageKey.length >= 1 && storageKey.length <= MAX_STORAGE_KEY_LENGTH) return storageKey;
  throw invalid([`storageKey must be 1 to ${MAX_STORAGE_KEY_LENGTH} characters`]);
}

function invalid(message: string[]): BadRequestException {
  return new BadRequestException({ statusCode: 400, error: 'Bad Request', code: 'VALIDATION_FAILED', message });
}

function described(res: StatusSetter, inspection: IdempotencyInspection): InspectAnswer {
  if (inspection.state !== 'not_a_record') return inspection;
  res.status(409);
  return { ...inspection, ...NOT_A_RECORD };
}

function answer(res: StatusSetter, result: IdempotencyForgetResult): ForgetAnswer {
  if (result.forgotten) return result;
  if (result.reason === 'not_a_record') {
    res.status(409);
    return { ...result, ...NOT_A_RECORD };
  }
  if (result.reason === 'in_progress') {
    res.status(409);
    return {
      ...result,
      code: 'IDEMPOTENCY_RECORD_IN_PROGRESS',
      message: 'A request holding this key is running: nothing was forgotten. Inspect it, and forget it once it completed.',
    };
  }
  res.status(404);
  return { ...result, code: 'IDEMPOTENCY_RECORD_ABSENT', message: 'No record under this key: nothing to forget.' };
}
