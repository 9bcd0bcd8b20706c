import { BadRequestException, Injectable, ValidationPipe, type ValidationError } from '@nestjs/common';

/** Every failed constraint as one message, nested properties prefixed with their path. */
const flattenMessages = (errors: ValidationError[], parentPath = ''): string[] =>
  errors.flatMap((error) => {
    const prefix = parentPath ? `${parentPath}.` : '';
    const own = Object.values(error.constraints ?? {}).map((message) => prefix + message);
    return [...own, ...flattenMessages(error.children ?? [], prefix + error.property)];
  });

/**
 * The demo's global ValidationPipe: strips nothing silently (unknown properties are a 400),
 * transforms bodies into DTO instances, and answers
 * `400 { statusCode, error, code: 'VALIDATION_FAILED', message: string[] }`.
 */
@Injectable()
export class DemoValidationPipe extends ValidationPipe {
  constructor() {
    super({
      whitelist: true,
      forbidNonWhitelisted: true,
      transform: true,
      exceptionFactory: (errors) =>
        new BadRequestException({
          statusCode: 400,
          error: 'Bad Request',
          code: 'VALIDATION_FAILED',
          message: flattenMessages(errors),
        }),
    });
  }
}
