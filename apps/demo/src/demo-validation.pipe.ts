import { BadRequestException, Injectable, ValidationPipe, type ValidationError } from '@nestjs/common';

/** Constraints that say what a value is: when one fails, the others (ranges, lengths) mean nothing. */
const TYPE_CONSTRAINTS = ['isDefined', 'isString', 'isNumber', 'isInt', 'isBoolean', 'isObject', 'isArray', 'whitelistValidation'];

/** The one message of a property: its type's, if that failed, else its first failed constraint's. */
function messageOf(constraints: Record<string, string>): string | undefined {
  const type = TYPE_CONSTRAINTS.find((name) => name in constraints);
  return type ? constraints[type] : Object.values(constraints)[0];
}

/** One message per failed property (never three that contradict), nested ones prefixed with their path. */
const flattenMessages = (errors: ValidationError[], parentPath = ''): string[] =>
  errors.flatMap((error) => {
    const prefix = parentPath ? `${parentPath}.` : '';
    const own = messageOf(error.constraints ?? {});
    return [...(own === undefined ? [] : [prefix + own]), ...flattenMessages(error.children ?? [], prefix + error.property)];
  });

/**
 * The demo's global ValidationPipe: strips nothing silently (unknown properties are a 400),
 * transforms bodies into DTO instances, and answers
 * `400 { statusCode, error, code: 'VALIDATION_FAILED', message: string[] }`, one message per field.
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
