import { Controller, Get, Param, Post, Req, Res, UseGuards } from '@nestjs/common';
import { HttpAdapterHost } from '@nestjs/core';
import { ContentDigest, ContentHash, readRequestId, REPLAYED_HEADER } from 'nestjs-idempotency';
import { CurrentUser } from '../current-user.decorator.js';
import type { DemoRequest, DemoUser } from '../demo-user.js';
import type { UploadView } from './upload.view.js';
import { requestIdInvalid } from './uploads.exceptions.js';
import { UploadsService } from './uploads.service.js';
import { XmlBodyGuard } from './xml-body.guard.js';

/** Which layer recognised a repeat: `request-id` or `content-hash`. */
export const MATCHED_BY_HEADER = 'Idempotent-Matched-By';

/**
 * XML receipt uploads, idempotent in two layers: the client's request id (`X-Request-Id` or
 * `X-Idempotency-Key`) and the SHA-256 of the raw bytes (`X-Content-Hash` or `If-Match`, checked
 * by `@ContentDigest()`, or computed when absent).
 */
@Controller('uploads')
export class UploadsController {
  constructor(
    private readonly uploads: UploadsService,
    private readonly adapterHost: HttpAdapterHost,
  ) {}

  /**
   * 201 with the upload; a repeat (same request id, or same bytes) gets the first upload's answer
   * with `Idempotent-Replayed: true` and `Idempotent-Matched-By`.
   */
  @Post('xml')
  @ContentDigest()
  // Method decorators apply bottom-up, so this guard runs first: 415 before any digest check.
  @UseGuards(XmlBodyGuard)
  async upload(
    @ContentHash() contentHash: string,
    @Req() req: DemoRequest & { body?: unknown; ip?: string },
    @CurrentUser() user: DemoUser | undefined,
    @Res({ passthrough: true }) res: unknown,
  ): Promise<unknown> {
    const requestId = readRequestId(req);
    if (requestId && 'invalid' in requestId) throw requestIdInvalid(requestId.invalid);
    const answer = await this.uploads.upload({
      // The XML parser is a raw one (demo-app.factory.ts): the body is the bytes as received.
      raw: Buffer.isBuffer(req.body) ? req.body : Buffer.alloc(0),
      contentHash,
      requestId: requestId?.requestId,
      userId: user?.id,
      clientAddress: req.ip,
    });
    const { httpAdapter } = this.adapterHost;
    httpAdapter.status(res, answer.statusCode);
    if (answer.matchedBy) {
      httpAdapter.setHeader(res, REPLAYED_HEADER, 'true');
      httpAdapter.setHeader(res, MATCHED_BY_HEADER, answer.matchedBy === 'request_id' ? 'request-id' : 'content-hash');
    }
    return answer.body;
  }

  @Get(':uploadId')
  findOne(@Param('uploadId') uploadId: string): Promise<UploadView> {
    return this.uploads.findById(uploadId);
  }
}
