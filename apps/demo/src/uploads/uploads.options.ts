/** Options of the XML upload endpoints (`AppModuleOptions.uploads`). */
export interface UploadsOptions {
  /** Largest XML body accepted, in bytes; a larger one gets 413. Default 1 MiB. */
  bodyLimitBytes?: number;
  /** How long an upload's claim holds while it is processed, ms; then a retry may take it over. Default 30,000. */
  leaseMs?: number;
  /** How long an upload's outcome is recognised (and replayed), ms. Default 7 days. */
  retentionMs?: number;
  /** How often expired outcome records are deleted, ms. Default 1 hour. */
  purgeIntervalMs?: number;
  /** FOR TESTS ONLY: hooks into the processing of an upload (see `UploadsFaults`). */
  faults?: UploadsFaults;
}

/** FOR TESTS ONLY: lets a test hold an upload between its claim and its write. */
export interface UploadsFaults {
  /** Awaited after the document was claimed and parsed, before the receipt is stored. */
  beforeStore?: (upload: { requestId?: string; contentHash: string; attempt: number }) => Promise<void>;
}

export const UPLOADS_OPTIONS = Symbol('UPLOADS_OPTIONS');

export const UPLOADS_DEFAULTS = Object.freeze({
  leaseMs: 30_000,
  retentionMs: 7 * 24 * 60 * 60 * 1000,
  purgeIntervalMs: 60 * 60 * 1000,
});
