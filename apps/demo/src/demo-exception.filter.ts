import { Catch, HttpException, HttpStatus, Logger, type ArgumentsHost, type ExceptionFilter } from '@nestjs/common';
import { HttpAdapterHost } from '@nestjs/core';
import { RpcException } from '@nestjs/microservices';
import { throwError, type Observable } from 'rxjs';
import { STATUS_CODES } from 'node:http';

/** The JSON every error answer has: Nest's usual shape plus a stable, machine-readable `code`. */
export interface ErrorBody {
  statusCode: number;
  error: string;
  code: string;
  message: string | string[];
  [extra: string]: unknown;
}

interface BodyError {
  statusCode: number;
  code: string;
  message: string;
}

const INVALID_JSON: BodyError = {
  statusCode: 400,
  code: 'INVALID_JSON',
  message: 'The request body is not valid JSON.',
};
const PAYLOAD_TOO_LARGE: BodyError = {
  statusCode: 413,
  code: 'PAYLOAD_TOO_LARGE',
  message: 'The request body is too large: the limit is 1 MiB.',
};
const UNSUPPORTED_MEDIA_TYPE: BodyError = {
  statusCode: 415,
  code: 'UNSUPPORTED_MEDIA_TYPE',
  message: 'Send the request body as JSON with "Content-Type: application/json".',
};
const UNSUPPORTED_CONTENT_ENCODING: BodyError = {
  statusCode: 415,
  code: 'UNSUPPORTED_MEDIA_TYPE',
  message: 'The request body\'s Content-Encoding is not supported: send it as it is, or as gzip, deflate or br.',
};
/** A body its Content-Encoding did not decode (Express inflates gzip, deflate and br). */
const INVALID_BODY_ENCODING: BodyError = {
  statusCode: 400,
  code: 'INVALID_BODY_ENCODING',
  message: 'The request body could not be decoded from its Content-Encoding.',
};
/** zlib's errors (`Z_DATA_ERROR`, `Z_BUF_ERROR`: a truncated body) and Brotli's (`ERR__ERROR_FORMAT_...`). */
const DECODING_ERROR = /^(?:Z_|ERR__ERROR_)/;

/**
 * Errors of the body parsers, by Express body-parser `type` and Fastify error `code`. Both
 * adapters hand them to the exception layer; they arrive as an HttpException whose `cause` is
 * the parser's error (or, should an adapter not wrap them, as that error itself).
 */
const BODY_ERRORS: Record<string, BodyError> = {
  'entity.parse.failed': INVALID_JSON,
  FST_ERR_CTP_INVALID_JSON_BODY: INVALID_JSON,
  FST_ERR_CTP_EMPTY_JSON_BODY: INVALID_JSON,
  'entity.too.large': PAYLOAD_TOO_LARGE,
  FST_ERR_CTP_BODY_TOO_LARGE: PAYLOAD_TOO_LARGE,
  FST_ERR_CTP_INVALID_MEDIA_TYPE: UNSUPPORTED_MEDIA_TYPE,
  'charset.unsupported': UNSUPPORTED_MEDIA_TYPE,
  'encoding.unsupported': UNSUPPORTED_CONTENT_ENCODING,
};

const bodyErrorOf = (exception: unknown): BodyError | undefined => {
  const candidates = [exception, exception instanceof Error ? exception.cause : undefined];
  for (const candidate of candidates) {
    if (typeof candidate !== 'object' || candidate === null) continue;
    const { type, code } = candidate as { type?: unknown; code?: unknown };
    const match = BODY_ERRORS[String(type)] ?? BODY_ERRORS[String(code)];
    if (match) return match;
    if (typeof code === 'string' && DECODING_ERROR.test(code)) return INVALID_BODY_ENCODING;
  }
  return undefined;
};

/**
 * PostgreSQL's refusals of a value (SQLSTATE class 22, "data exception") that a request can
 * cause: the backstop behind the DTO validators and pipes, which should refuse these first.
 */
const REFUSED_VALUES = new Map<string, string>([
  ['22021', 'a text value holds a character that cannot be stored (such as NUL)'],
  ['22P05', 'a text value holds a character that cannot be stored (such as NUL)'],
  ['22001', 'a text value is too long'],
  ['22003', 'a number is out of range'],
  ['22007', 'a date or time has the wrong format'],
  ['22008', 'a date or time is out of range'],
  ['22P02', 'a value has the wrong format'],
]);

/** The SQLSTATE of a PostgreSQL error: TypeORM's `QueryFailedError` keeps the driver's in `driverError`. */
const sqlStateOf = (exception: unknown): string | undefined => {
  if (typeof exception !== 'object' || exception === null) return undefined;
  const { driverError, code } = exception as { driverError?: { code?: unknown }; code?: unknown };
  const state = driverError?.code ?? code;
  return typeof state === 'string' ? state : undefined;
};

/** `NOT_FOUND`, `BAD_REQUEST`...: the name of the status in Nest's `HttpStatus`. */
const codeOfStatus = (status: number): string => HttpStatus[status] ?? `HTTP_${status}`;

const hasCode = (response: unknown): response is ErrorBody =>
  typeof response === 'object' && response !== null && typeof (response as { code?: unknown }).code === 'string';

/**
 * Turns every error into a JSON answer with a stable `code`, on Express and Fastify alike:
 * - body parser errors: 400 `INVALID_JSON`, 413 `PAYLOAD_TOO_LARGE`, 415 `UNSUPPORTED_MEDIA_TYPE`;
 * - an HttpException whose body has a `code` (the idempotency guard's, the app's own) as is;
 * - any other HttpException: its body plus a `code` named after its status (`NOT_FOUND`);
 * - a value PostgreSQL refused (a NUL, too long, out of range): 400 `VALIDATION_FAILED`, logged
 *   as a warning (validation at the edge missed it);
 * - anything else: 500 `INTERNAL_ERROR`, logged, with no detail sent to the client.
 * Headers already set on the response (`Retry-After` from the idempotency guard) are kept.
 */
@Catch()
export class DemoExceptionFilter implements ExceptionFilter {
  private readonly logger = new Logger(DemoExceptionFilter.name);

  constructor(private readonly adapterHost: HttpAdapterHost) {}

  catch(exception: unknown, host: ArgumentsHost): void | Observable<never> {
    // Message handlers (the Redis transport) answer the caller with the error's body instead.
    if (host.getType() === 'rpc') {
      const error = exception instanceof RpcException ? exception.getError() : this.toBody(exception);
      return throwError(() => error);
    }
    const { httpAdapter } = this.adapterHost;
    const response: unknown = host.switchToHttp().getResponse();
    const body = this.toBody(exception);
    // A body with its own `code` is passed through as is: the exception decides the status.
    const status = exception instanceof HttpException ? exception.getStatus() : body.statusCode;
    if (httpAdapter.isHeadersSent(response)) {
      this.logger.error('Error after the response was sent', exception instanceof Error ? exception.stack : exception);
      httpAdapter.end(response);
      return;
    }
    const retryAfterSeconds = (exception as { retryAfterSeconds?: unknown } | null)?.retryAfterSeconds;
    if (typeof retryAfterSeconds === 'number' && !httpAdapter.getHeader(response, 'retry-after')) {
      httpAdapter.setHeader(response, 'Retry-After', String(retryAfterSeconds));
    }
    httpAdapter.reply(response, body, status);
  }

  private toBody(exception: unknown): ErrorBody {
    if (exception instanceof HttpException && hasCode(exception.getResponse())) {
      return exception.getResponse() as ErrorBody;
    }

    const bodyError = bodyErrorOf(exception);
    if (bodyError) {
      const { statusCode, code, message } = bodyError;
      return { statusCode, error: STATUS_CODES[statusCode] ?? 'Error', code, message };
    }

    if (exception instanceof HttpException) {
      const statusCode = exception.getStatus();
      const response = exception.getResponse();
      if (statusCode >= 500) this.logger.error(exception.message, exception.stack);
      const fields = typeof response === 'string' ? { message: response } : response;
      return {
        statusCode,
        error: STATUS_CODES[statusCode] ?? 'Error',
        message: exception.message,
        ...fields,
        code: codeOfStatus(statusCode),
      };
    }

    const sqlState = sqlStateOf(exception);
    const refused = sqlState === undefined ? undefined : REFUSED_VALUES.get(sqlState);
    if (refused) {
      this.logger.warn(`PostgreSQL refused a value of a request (${sqlState}): validate it before the query. ${(exception as Error).message}`);
      return { statusCode: 400, error: 'Bad Request', code: 'VALIDATION_FAILED', message: [`The request cannot be stored: ${refused}.`] };
    }

    this.logger.error(
      exception instanceof Error ? exception.message : 'Non-error thrown',
      exception instanceof Error ? exception.stack : String(exception),
    );
    return {
      statusCode: 500,
      error: 'Internal Server Error',
      code: 'INTERNAL_ERROR',
      message: 'Something went wrong on our side: please retry later.',
    };
  }
}
