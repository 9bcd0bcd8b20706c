/**
 * How the library's HTTP refusals are written: `'nest'`, Nest's usual JSON plus `code`
 * (`{ statusCode, error, message, code }`), or `'problem+json'`, RFC 9457 problem details
 * (`{ type, title, status, detail, code }`) sent as `application/problem+json`.
 */
export type ErrorFormat = 'nest' | 'problem+json';

export const ERROR_FORMATS: readonly ErrorFormat[] = ['nest', 'problem+json'];

/** The media type of RFC 9457 problem details. */
export const PROBLEM_JSON_CONTENT_TYPE = 'application/problem+json';

/**
 * Every problem `type` is this prefix and the answer's `code`, e.g.
 * `tag:nestjs-idempotency,2026:IDEMPOTENCY_KEY_MISSING`. A tag URI (RFC 4151): absolute, so it is
 * the same on every host and behind every prefix (a relative `/problems/...` would resolve
 * against each API's own URL), and it does not pretend to be a page (the project has no website).
 * RFC 9457 lets a type be a URI that is not dereferenced. Stable: clients may compare it.
 */
export const PROBLEM_TYPE_PREFIX = 'tag:nestjs-idempotency,2026:';

/** An RFC 9457 problem details object, with the library's `code` and any extension members. */
export interface ProblemDetails {
  /** `PROBLEM_TYPE_PREFIX` + `code`: what kind of problem, for machines. */
  type: string;
  /** A short summary of the kind, the same for every occurrence. */
  title: string;
  /** The HTTP status of the answer. */
  status: number;
  /** What happened this time and what to do next: the message of the `'nest'` format. */
  detail: string;
  /** The stable code, as in the `'nest'` format. */
  code: string;
  [extension: string]: unknown;
}

export function problemDetails(
  code: string,
  status: number,
  title: string,
  detail: string,
  extensions: Record<string, unknown> = {},
): ProblemDetails {
  return { type: `${PROBLEM_TYPE_PREFIX}${code}`, title, status, detail, code, ...extensions };
}
