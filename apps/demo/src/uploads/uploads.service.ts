import { HttpException, Inject, Injectable, Logger } from '@nestjs/common';
import { createHash } from 'node:crypto';
import { InjectRepository } from '@nestjs/typeorm';
import type { Repository } from 'typeorm';
import {
  PostgresOutcomeRecorder,
  type HeldOutcome,
  type MatchedBy,
  type RecordedOutcome,
} from 'nestjs-idempotency/typeorm';
import { parseReceipt } from './receipt-xml.js';
import { toUploadView } from './upload.view.js';
import { UPLOADS_OPTIONS, type UploadsOptions } from './uploads.options.js';
import { clipText, requestIdReused, uploadInProgress, uploadNotFound, uploadSuperseded } from './uploads.exceptions.js';
import { XmlUpload } from './xml-upload.entity.js';

/** An upload as it arrived: its raw bytes, their SHA-256, and who sent it under which request id. */
export interface UploadInput {
  raw: Uint8Array;
  contentHash: string;
  requestId?: string;
  userId?: string;
  /** The client's address as the HTTP adapter trusts it (`request.ip`): the scope of an anonymous upload. */
  clientAddress?: string;
}

/** The answer to an upload: processed now, or the first upload's answer (`matchedBy` says how). */
export interface UploadAnswer extends RecordedOutcome {
  matchedBy?: MatchedBy;
}

const UUID = /^[0-9a-f]{8}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{4}-[0-9a-f]{12}$/i;

/**
 * Outcome records are kept per uploader, so one uploader's upload is never replayed to (or held
 * in progress against) another: per user, else per client address. Behind a proxy, configure the
 * adapter to trust it (Express `trust proxy`, Fastify `trustProxy`), or every anonymous client
 * has the proxy's address.
 */
const scopeOf = ({ userId, clientAddress = 'unknown' }: UploadInput) => {
  if (userId) return `uploads.xml:user:${userId}`;
  // An address taken from a trusted proxy's header can be any text: a long one is hashed, to fit the column.
  const address = clientAddress.length <= 64 ? clientAddress : createHash('sha256').update(clientAddress).digest('hex');
  return `uploads.xml:anonymous:${address}`;
};

/** Longest message a FAILED record keeps (it is kept for the retention, 7 days by default). */
export const MAX_STORED_MESSAGE_LENGTH = 500;

/**
 * What a FAILED record keeps of a refusal: status, code and message, the message cut to
 * {@link MAX_STORED_MESSAGE_LENGTH} (a parser's message may quote the document). FAILED records
 * are never replayed; they say why the last attempt failed.
 */
const failureOutcome = (error: unknown): RecordedOutcome => {
  if (!(error instanceof HttpException)) return { statusCode: 500, body: { code: 'INTERNAL_ERROR' } };
  const response = error.getResponse();
  const { code, message } = (typeof response === 'object' && response !== null ? response : { message: response }) as {
    code?: unknown;
    message?: unknown;
  };
  const text = Array.isArray(message) ? message.join('; ') : String(message ?? error.message);
  return {
    statusCode: error.getStatus(),
    body: {
      statusCode: error.getStatus(),
      ...(typeof code === 'string' ? { code: clipText(code, 64) } : {}),
      message: clipText(text, MAX_STORED_MESSAGE_LENGTH),
    },
  };
};

@Injectable()
export class UploadsService {
  private readonly logger = new Logger(UploadsService.name);

  constructor(
    private readonly recorder: PostgresOutcomeRecorder,
    @InjectRepository(XmlUpload) private readonly uploads: Repository<XmlUpload>,
    @Inject(UPLOADS_OPTIONS) private readonly options: UploadsOptions,
  ) {}

  /**
   * Two layers, one statement: the request id's record, else the content hash's, answers a
   * repeat with the first upload's recorded answer (or 409 while it runs, 422 for a request id
   * reused with other content); a new upload, or a retry of a FAILED or abandoned one, is
   * processed here.
   */
  async upload(input: UploadInput): Promise<UploadAnswer> {
    const claim = await this.recorder.claim({ scope: scopeOf(input), requestId: input.requestId, contentHash: input.contentHash });
    switch (claim.status) {
      case 'success':
        return { ...claim.outcome, matchedBy: claim.matchedBy };
      case 'processing':
        throw uploadInProgress(Math.max(1, Math.ceil(claim.retryAfterMs / 1000)));
      case 'mismatch':
        throw requestIdReused();
      case 'acquired':
        return this.process(claim.held, input);
    }
  }

  async findById(uploadId: string) {
    const upload = UUID.test(uploadId) ? await this.uploads.findOneBy({ id: uploadId }) : null;
    if (!upload) throw uploadNotFound();
    return toUploadView(upload);
  }

  /**
   * Parses, then stores the receipt and records SUCCESS in one transaction that holds the
   * outcome record (fenced by the claim's token). A refusal (bad XML, not a receipt) or an
   * error is recorded as FAILED, so that the client may fix the document and retry.
   */
  private async process(held: HeldOutcome, input: UploadInput): Promise<UploadAnswer> {
    let result: Awaited<ReturnType<PostgresOutcomeRecorder['succeedWith']>>;
    try {
      const receipt = parseReceipt(input.raw);
      await this.options.faults?.beforeStore?.({ requestId: input.requestId, contentHash: input.contentHash, attempt: held.attempt });
      result = await this.recorder.succeedWith(held, async (manager) => {
        const repo = manager.getRepository(XmlUpload);
        const upload = repo.create({
          userId: input.userId ?? null,
          requestId: input.requestId ?? null,
          contentHash: input.contentHash,
          receiptNo: receipt.no,
          amount: receipt.amount,
        });
        const { generatedMaps } = await repo.insert(upload);
        repo.merge(upload, generatedMaps[0] as Partial<XmlUpload>);
        return { statusCode: 201, body: toUploadView(upload) };
      });
    } catch (error) {
      await this.recordFailure(held, error);
      throw error;
    }
    if (!result.recorded) throw uploadSuperseded();
    return result.outcome;
  }

  private async recordFailure(held: HeldOutcome, error: unknown): Promise<void> {
    try {
      if (!(await this.recorder.fail(held, failureOutcome(error)))) this.logger.warn('An upload failed after its record was taken over');
    } catch (failure) {
      // The record stays PROCESSING until its lease ends; then a retry takes it over.
      this.logger.error(`Could not record a failed upload: ${(failure as Error).message}`);
    }
  }
}
