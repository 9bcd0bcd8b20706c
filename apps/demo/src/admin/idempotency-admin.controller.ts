import { BadRequestException, Controller, Delete, Get, Param, Query, Res, UseGuards } from '@nestjs/common';
import { ApiExcludeController } from '@nestjs/swagger';
import {
  IdempotencyAdmin,
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
    @Query('user') user?: string,
  ): Promise<InspectAnswer> {
    return described(res, await this.admin.inspect(recordRef(handler, key, user)));
  }

  @Delete(':handler/:key')
  async forget(
    @Param('handler') handler: string,
    @Param('key') key: string,
    @Res({ passthrough: true }) res: StatusSetter,
    @Query('user') user?: string,
  ): Promise<ForgetAnswer> {
    return answer(res, await this.admin.forget(recordRef(handler, key, user)));
  }

  @Get()
  async inspectStorageKey(@Res({ passthrough: true }) res: StatusSetter, @Query('storageKey') storageKey?: string): Promise<InspectAnswer> {
    return described(res, await this.admin.inspect({ storageKey: checkedStorageKey(storageKey) }));
  }

  @Delete()
  async forgetStorageKey(@Res({ passthrough: true }) res: StatusSetter, @Query('storageKey') storageKey?: string): Promise<ForgetAnswer> {
    return answer(res, await this.admin.forget({ storageKey: checkedStorageKey(storageKey) }));
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
