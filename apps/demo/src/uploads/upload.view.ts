import type { XmlUpload } from './xml-upload.entity.js';

/** What the API answers for an upload (the first answer, replayed to repeats). */
export interface UploadView {
  uploadId: string;
  contentHash: string;
  requestId: string | null;
  status: 'SUCCESS';
  receipt: { no: string; amount: number };
  createdAt: Date;
}

export const toUploadView = (upload: XmlUpload): UploadView => ({
  uploadId: upload.id,
  contentHash: upload.contentHash,
  requestId: upload.requestId,
  status: 'SUCCESS',
  receipt: { no: upload.receiptNo, amount: upload.amount },
  createdAt: upload.createdAt,
});
