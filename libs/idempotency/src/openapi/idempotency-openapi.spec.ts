import { describe, expect, it } from '@jest/globals';
import { Controller, Get, Headers, HttpCode, Post } from '@nestjs/common';
import {
  ApiConflictResponse,
  ApiCreatedResponse,
  ApiHeader,
  ApiProperty,
  ApiResponse,
  DocumentBuilder,
  SwaggerModule,
  type OpenAPIObject,
} from '@nestjs/swagger';
import { Test } from '@nestjs/testing';
import { ContentDigest } from '../content-digest/content-digest.decorator.js';
import { NoRepeatSubmit } from '../decorators/no-repeat-submit.decorator.js';
import { IdempotencyErrorCode } from '../errors/idempotency-http.exceptions.js';
import { IdempotencyModule } from '../idempotency.module.js';
import { MemoryIdempotencyStore } from '../stores/memory/memory-idempotency.store.js';
import type { IdempotencyModuleOptions } from '../idempotency.options.js';

class OrderDto {
  @ApiProperty()
  orderNo!: string;
}

class OrderTakenDto {
  @ApiProperty()
  takenBy!: string;
}

@Controller('orders')
class OrdersController {
  @Post()
  @NoRepeatSubmit()
  create() {}

  @Post('above')
  @ApiCreatedResponse({ type: OrderDto, description: 'The order' })
  @NoRepeatSubmit()
  createAbove() {}

  @Post('below')
  @NoRepeatSubmit()
  @ApiCreatedResponse({ type: OrderDto, description: 'The order' })
  createBelow() {}

  @Post('confirm')
  @HttpCode(200)
  @NoRepeatSubmit({ idempotentKey: '#body.orderNo' })
  confirm() {}

  @Post('fingerprinted')
  @NoRepeatSubmit({ useRequestFingerprint: true, failMode: 'open' })
  fingerprinted() {}

  @Post('taken')
  @NoRepeatSubmit({ idempotentKey: '#body.orderNo' })
  @ApiConflictResponse({ type: OrderTakenDto, description: 'The order number belongs to another user' })
  taken() {}

  @Post('own-header')
  @ApiHeader({ name: 'Idempotency-Key', description: 'Our own words', required: true })
  @NoRepeatSubmit()
  ownHeader() {}

  @Get(':orderNo')
  findOne() {}
}

@Controller('payments')
@ApiResponse({ status: 403, description: 'Not your account' })
@NoRepeatSubmit({ idempotentKey: '#body.ref' })
class PaymentsController {
  @Post()
  pay() {}

  @Get(':ref')
  status() {}

  @Post('refund')
  @HttpCode(202)
  @NoRepeatSubmit({ failMode: 'open' })
  refund() {}
}

/** What the @nestjs/swagger CLI plugin adds to a compiled controller (the handler's return type). */
@Controller('invoices')
class InvoicesController {
  static _OPENAPI_METADATA_FACTORY() {
    return { create: { type: OrderDto } };
  }

  @Post()
  @NoRepeatSubmit()
  create() {}
}

@Controller('legacy')
class LegacyController {
  @Post()
  @NoRepeatSubmit({ failMode: 'closed' })
  pay() {}
}

@Controller('uploads')
class UploadsController {
  @Post('plain')
  @ContentDigest()
  plain() {}

  @Post('required')
  @ContentDigest({ required: true })
  required() {}

  @Post('guarded')
  @NoRepeatSubmit()
  @ContentDigest()
  guarded() {}

  @Post('problem')
  @ContentDigest({ errorFormat: 'problem+json' })
  problem() {}

  @Post('own')
  @ApiResponse({ status: 415, description: 'Only XML' })
  @ContentDigest()
  own() {}

  @Post('mixed')
  @NoRepeatSubmit({ errorFormat: 'problem+json' })
  @ContentDigest()
  mixed() {}
}

@Controller('digested')
@ContentDigest()
class DigestedController {
  @Post()
  create() {}
}

async function openApiDocument(...controllers: (new (...args: never[]) => unknown)[]): Promise<OpenAPIObject> {
  return openApiDocumentUnder({ failMode: 'closed' }, ...controllers);
}

/** The document of an app whose module has `options`. */
async function openApiDocumentUnder(options: IdempotencyModuleOptions, ...controllers: (new (...args: never[]) => unknown)[]): Promise<OpenAPIObject> {
  const moduleRef = await Test.createTestingModule({
    imports: [IdempotencyModule.forRoot({ store: new MemoryIdempotencyStore(), ...options })],
    controllers,
  }).compile();
  const app = moduleRef.createNestApplication({ logger: false });
  try {
    return SwaggerModule.createDocument(app, new DocumentBuilder().build());
  } finally {
    await app.close();
  }
}

const codesOf = (response: any): string[] => [...response.content['application/json'].schema.properties.code.enum].sort();

/** The guard's answers, per status, with every code each status can carry. */
const GUARD_CODES: Record<string, string[]> = {
  400: ['IDEMPOTENCY_KEY_INVALID', 'IDEMPOTENCY_KEY_MISSING', 'IDEMPOTENCY_PAYLOAD_UNSUPPORTED'],
  409: ['IDEMPOTENCY_IN_PROGRESS', 'IDEMPOTENCY_RESPONSE_NOT_REPLAYABLE'],
  422: ['IDEMPOTENCY_KEY_REUSED'],
  500: ['IDEMPOTENCY_USER_UNRESOLVED'],
  503: ['IDEMPOTENCY_STORE_UNAVAILABLE'],
};

function expectGuardAnswers(responses: Record<string, any>, statuses = ['400', '409', '422', '500', '503']) {
  for (const status of statuses) {
    expect([status, codesOf(responses[status])]).toEqual([status, GUARD_CODES[status]]);
    for (const code of GUARD_CODES[status]) expect(responses[status].description).toContain(code);
  }
  expect(responses['409'].headers).toHaveProperty('Retry-After');
  expect(responses['409'].description).toMatch(/IDEMPOTENCY_RESPONSE_NOT_REPLAYABLE[^\n]*do not retry/i);
  if (statuses.includes('503')) expect(responses['503'].headers).toHaveProperty('Retry-After');
}

describe('OpenAPI documentation of @NoRepeatSubmit routes', () => {
  it('keeps the default success response of a guarded POST with no swagger decorator (201)', async () => {
    const document = await openApiDocument(OrdersController);
    const responses = document.paths['/orders'].post!.responses as Record<string, any>;
    expect(responses['201']).toEqual({ description: '' });
    expectGuardAnswers(responses);
  });

  it('documents every code the guard has, each under the status its exception carries', async () => {
    const document = await openApiDocument(OrdersController);
    const responses = document.paths['/orders'].post!.responses as Record<string, any>;
    const documentedCodes = Object.keys(GUARD_CODES).flatMap((status) => codesOf(responses[status]));
    expect(documentedCodes.sort()).toEqual(Object.values(IdempotencyErrorCode).sort());
    for (const status of Object.keys(GUARD_CODES)) {
      expect(responses[status].content['application/json'].schema.properties.statusCode.enum).toEqual([Number(status)]);
    }
  });

  // helper-219: a route with required: false runs unguarded without a key, yet was documented as
  // answering 400 IDEMPOTENCY_KEY_MISSING.
  it('documents no IDEMPOTENCY_KEY_MISSING where a call without a key runs unguarded (required: false)', async () => {
    @Controller('drafts')
    class DraftsController {
      @Post()
      @NoRepeatSubmit({ required: false })
      save() {}

      @Post('fingerprinted')
      @NoRepeatSubmit({ required: false, useRequestFingerprint: true })
      fingerprinted() {}
    }
    const document = await openApiDocument(DraftsController);
    expect(codesOf((document.paths['/drafts'].post!.responses as Record<string, any>)['400'])).toEqual(['IDEMPOTENCY_KEY_INVALID', 'IDEMPOTENCY_PAYLOAD_UNSUPPORTED']);
    // helper-220: without a key, a known user's call is keyed by its fingerprint, an anonymous one runs unguarded.
    expect(codesOf((document.paths['/drafts/fingerprinted'].post!.responses as Record<string, any>)['400'])).toEqual(['IDEMPOTENCY_KEY_INVALID', 'IDEMPOTENCY_PAYLOAD_UNSUPPORTED']);
  });

  it.each([
    ['above', '/orders/above'],
    ['below', '/orders/below'],
  ])('keeps @ApiCreatedResponse({ type }) written %s @NoRepeatSubmit()', async (_, path) => {
    const document = await openApiDocument(OrdersController);
    const responses = document.paths[path].post!.responses as Record<string, any>;
    expect(responses['201']).toMatchObject({
      description: 'The order',
      content: { 'application/json': { schema: { $ref: '#/components/schemas/OrderDto' } } },
    });
    expectGuardAnswers(responses);
  });

  it('keeps the @HttpCode status as the success response, and no 201', async () => {
    const document = await openApiDocument(OrdersController);
    const responses = document.paths['/orders/confirm'].post!.responses as Record<string, any>;
    expect(responses['200']).toEqual({ description: '' });
    expect(responses['201']).toBeUndefined();
    expectGuardAnswers(responses);
    expect(responses['400'].description).toContain('the body field "orderNo"');
  });

  it('documents every write of a class-level @NoRepeatSubmit controller, with its own success response, and not its reads', async () => {
    const document = await openApiDocument(PaymentsController);
    const pay = document.paths['/payments'].post!.responses as Record<string, any>;
    expect(pay['201']).toEqual({ description: '' });
    expect(pay['403']).toEqual({ description: 'Not your account' });
    expectGuardAnswers(pay);
    // A read is not guarded by a class-level decorator (its default methods are the writes).
    const status = document.paths['/payments/{ref}'].get!.responses as Record<string, any>;
    expect(Object.keys(status).sort()).toEqual(['200', '403']); // its own and the user's class-level 403
    // A method's own @NoRepeatSubmit merges over the class's: its fail mode wins, the class's key
    // (#body.ref) stays, so no Idempotency-Key header is documented.
    const refund = document.paths['/payments/refund'].post!;
    expect(refund.responses['202']).toEqual({ description: '' });
    expectGuardAnswers(refund.responses);
    const unavailable = (refund.responses as Record<string, any>)['503'].description as string;
    expect(unavailable).toContain('the app is shutting down');
    expect(unavailable).not.toContain('fails closed');
    expect(refund.parameters ?? []).not.toContainEqual(expect.objectContaining({ name: 'Idempotency-Key' }));
    expect(document.paths['/payments'].post!.parameters ?? []).not.toContainEqual(
      expect.objectContaining({ name: 'Idempotency-Key' }),
    );
  });

  it('keeps the success response the swagger CLI plugin infers from the return type', async () => {
    const document = await openApiDocument(InvoicesController);
    const responses = document.paths['/invoices'].post!.responses as Record<string, any>;
    expect(responses['201']).toMatchObject({
      content: { 'application/json': { schema: { $ref: '#/components/schemas/OrderDto' } } },
    });
    expectGuardAnswers(responses);
  });

  it("keeps the user's own answer for a status the guard also uses, and adds the guard's codes to it", async () => {
    const document = await openApiDocument(OrdersController);
    const conflict = (document.paths['/orders/taken'].post!.responses as Record<string, any>)['409'];
    expect(conflict.content['application/json'].schema).toEqual({ $ref: '#/components/schemas/OrderTakenDto' });
    expect(conflict.description).toMatch(/^The order number belongs to another user/);
    expect(conflict.description).toContain('IDEMPOTENCY_IN_PROGRESS');
    expect(conflict.description).toContain('IDEMPOTENCY_RESPONSE_NOT_REPLAYABLE');
    expect(conflict.headers).toHaveProperty('Retry-After');
  });

  it('documents the Idempotency-Key header only where the key is that header, keeping a user-written one', async () => {
    const document = await openApiDocument(OrdersController);
    const keyHeaders = (path: string) =>
      (document.paths[path].post!.parameters ?? []).filter((p: any) => p.in === 'header' && /^idempotency-key$/i.test(p.name));
    expect(keyHeaders('/orders')).toEqual([
      expect.objectContaining({ name: 'Idempotency-Key', required: true, schema: expect.objectContaining({ maxLength: 255 }) }),
    ]);
    expect(keyHeaders('/orders/fingerprinted')).toEqual([expect.objectContaining({ required: false })]);
    expect(keyHeaders('/orders/confirm')).toEqual([]);
    expect(keyHeaders('/orders/own-header')).toEqual([expect.objectContaining({ description: 'Our own words' })]);
  });

  it('documents the key header once where the handler also reads it with @Headers() under another case', async () => {
    // Swagger documents @Headers('idempotency-key') itself, under that exact name: the key header was listed twice (an adversarial helper).
    @Controller('reads-key')
    class ReadsKeyController {
      @Post()
      @NoRepeatSubmit()
      create(@Headers('idempotency-key') key: string) {
        return { key };
      }
    }
    const document = await openApiDocument(ReadsKeyController);
    const keyHeaders = (document.paths['/reads-key'].post!.parameters ?? []).filter((p: any) => p.in === 'header' && /^idempotency-key$/i.test(p.name));
    expect(keyHeaders).toEqual([expect.objectContaining({ name: 'idempotency-key', required: true, schema: expect.objectContaining({ maxLength: 255 }) })]);
  });

  // A shutting-down instance refuses every guarded call 503 (Retry-After: 1), so that its client
  // goes to another instance: a fail-open route answers 503 then too.
  it('documents 503 where the route fails open as the answer of an instance shutting down, and leaves unguarded routes alone', async () => {
    const document = await openApiDocument(OrdersController);
    const responses = document.paths['/orders/fingerprinted'].post!.responses as Record<string, any>;
    expectGuardAnswers(responses);
    expect(responses['503'].description).toMatch(/IDEMPOTENCY_STORE_UNAVAILABLE: the app is shutting down/);
    expect(responses['503'].description).not.toContain('unreachable');
    expect(document.paths['/orders/{orderNo}'].get!.responses).toEqual({ '200': { description: '' } });
  });

  it("follows the module's fail mode for a route without its own, when the module passes it", async () => {
    @Controller('closed-by-module')
    class ClosedByModuleController {
      @Post()
      @NoRepeatSubmit()
      create() {}

      @Post('open')
      @NoRepeatSubmit({ failMode: 'open' })
      open() {}
    }
    @Controller('open-by-module')
    class OpenByModuleController {
      @Post()
      @NoRepeatSubmit()
      create() {}

      @Post('closed')
      @NoRepeatSubmit({ failMode: 'closed' })
      closed() {}
    }
    const documents = [await openApiDocumentUnder({ failMode: 'closed' }, ClosedByModuleController), await openApiDocumentUnder({ failMode: 'open' }, OpenByModuleController)];
    const unavailable = (path: string) =>
      (documents.find((document) => document.paths[path])!.paths[path].post!.responses as Record<string, any>)['503'].description as string;
    expect(unavailable('/closed-by-module')).toContain('unreachable');
    expect(unavailable('/closed-by-module/open')).not.toContain('unreachable');
    expect(unavailable('/open-by-module')).not.toContain('unreachable');
    expect(unavailable('/open-by-module/closed')).toContain('unreachable');
    for (const path of ['/closed-by-module', '/closed-by-module/open', '/open-by-module', '/open-by-module/closed']) {
      expect(unavailable(path)).toContain('the app is shutting down');
    }
  });

  it('documents problem details under application/problem+json where the module or the route asks for them', async () => {
    @Controller('problem-by-module')
    class ProblemByModuleController {
      @Post()
      @NoRepeatSubmit()
      create() {}

      @Post('nest')
      @NoRepeatSubmit({ errorFormat: 'nest' })
      nest() {}
    }
    @Controller('problem-by-route')
    class ProblemByRouteController {
      @Post()
      @NoRepeatSubmit({ errorFormat: 'problem+json' })
      create() {}
    }
    const documents = [await openApiDocumentUnder({ errorFormat: 'problem+json' }, ProblemByModuleController), await openApiDocument(ProblemByRouteController)];
    for (const path of ['/problem-by-module', '/problem-by-route']) {
      const responses = documents.find((document) => document.paths[path])!.paths[path].post!.responses as Record<string, any>;
      for (const status of ['400', '409', '422', '500', '503']) {
        expect([path, status, Object.keys(responses[status].content)]).toEqual([path, status, ['application/problem+json']]);
        const { required, properties } = responses[status].content['application/problem+json'].schema;
        expect(required).toEqual(['type', 'title', 'status', 'detail', 'code']);
        expect([...properties.code.enum].sort()).toEqual(GUARD_CODES[status]);
        expect([...properties.type.enum].sort()).toEqual(GUARD_CODES[status].map((code) => `tag:nestjs-idempotency,2026:${code}`));
      }
      expect(responses['409'].headers).toHaveProperty('Retry-After');
    }
    expect(Object.keys((documents[0].paths['/problem-by-module/nest'].post!.responses as Record<string, any>)['400'].content)).toEqual(['application/json']);
  });

  it('adds the Idempotency-Key header and the 400/409/422/503 answers', async () => {
    const document = await openApiDocument(LegacyController);
    const operation = document.paths['/legacy'].post!;
    expect(operation.parameters).toContainEqual(
      expect.objectContaining({
        name: 'Idempotency-Key',
        in: 'header',
        required: true,
        schema: expect.objectContaining({ maxLength: 255 }),
      }),
    );
    expect(Object.keys(operation.responses)).toEqual(expect.arrayContaining(['201', '400', '409', '422', '503']));
  });
});

describe('OpenAPI documentation of @ContentDigest routes', () => {
  const DIGEST_400 = ['CONTENT_HASH_INVALID', 'CONTENT_HASH_MISMATCH'];
  const DIGEST_415 = ['CONTENT_HASH_ENCODING_UNSUPPORTED', 'CONTENT_HASH_UNAVAILABLE'];

  // Before: @ContentDigest's refusals were not documented (the README said to add them by hand).
  it('documents its 400 and 415 answers, each code described, keeping the default success response', async () => {
    const doc = await openApiDocument(UploadsController, DigestedController);
    for (const path of ['/uploads/plain', '/digested']) {
      const responses = doc.paths[path].post!.responses as Record<string, any>;
      expect([path, Object.keys(responses).sort()]).toEqual([path, ['201', '400', '415']]);
      expect(codesOf(responses['400'])).toEqual(DIGEST_400);
      expect(codesOf(responses['415'])).toEqual(DIGEST_415);
      for (const code of [...DIGEST_400, ...DIGEST_415]) expect(responses[code.endsWith('MISMATCH') || code.endsWith('INVALID') ? '400' : '415'].description).toContain(code);
    }
  });

  it('documents CONTENT_HASH_MISSING only where the route requires a digest', async () => {
    const doc = await openApiDocument(UploadsController);
    expect(codesOf((doc.paths['/uploads/required'].post!.responses as Record<string, any>)['400'])).toEqual(['CONTENT_HASH_INVALID', 'CONTENT_HASH_MISMATCH', 'CONTENT_HASH_MISSING']);
  });

  it("joins its codes to the guard's on a route that has both", async () => {
    const responses = (await openApiDocument(UploadsController)).paths['/uploads/guarded'].post!.responses as Record<string, any>;
    expect(codesOf(responses['400'])).toEqual([...GUARD_CODES['400'], ...DIGEST_400].sort());
    expect(codesOf(responses['415'])).toEqual(DIGEST_415);
    expect(codesOf(responses['409'])).toEqual(GUARD_CODES['409']);
    for (const code of [...GUARD_CODES['400'], ...DIGEST_400]) expect(responses['400'].description).toContain(code);
  });

  it('documents problem details under application/problem+json where it writes them, and keeps a status the route documents itself', async () => {
    const responses = (await openApiDocument(UploadsController)).paths['/uploads/problem'].post!.responses as Record<string, any>;
    expect([...responses['400'].content['application/problem+json'].schema.properties.code.enum].sort()).toEqual(DIGEST_400);
    expect(responses['400'].content['application/json']).toBeUndefined();
    const own = (await openApiDocument(UploadsController)).paths['/uploads/own'].post!.responses as Record<string, any>;
    expect(own['415'].description).toMatch(/^Only XML\n\n/);
    for (const code of DIGEST_415) expect(own['415'].description).toContain(code);
  });

  it("documents each one's format where the guard and @ContentDigest write theirs differently", async () => {
    const responses = (await openApiDocument(UploadsController)).paths['/uploads/mixed'].post!.responses as Record<string, any>;
    const content = responses['400'].content;
    expect([...content['application/json'].schema.properties.code.enum].sort()).toEqual(DIGEST_400);
    expect([...content['application/problem+json'].schema.properties.code.enum].sort()).toEqual(GUARD_CODES['400']);
    expect(responses['400'].description).toMatch(/^Refused by the idempotency guard or @ContentDigest;/);
  });
});
