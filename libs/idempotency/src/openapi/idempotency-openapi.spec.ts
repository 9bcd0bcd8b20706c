import { describe, expect, it } from '@jest/globals';
import { Controller, Post } from '@nestjs/common';
import { DocumentBuilder, SwaggerModule } from '@nestjs/swagger';
import { Test } from '@nestjs/testing';
import { NoRepeatSubmit } from '../decorators/no-repeat-submit.decorator.js';
import { IdempotencyModule } from '../idempotency.module.js';
import { MemoryIdempotencyStore } from '../stores/memory/memory-idempotency.store.js';

@Controller('payments')
class PaymentsController {
  @Post()
  @NoRepeatSubmit({ failMode: 'closed' })
  pay() {}
}

describe('OpenAPI documentation of @NoRepeatSubmit routes', () => {
  it('adds the Idempotency-Key header and the 400/409/422/503 answers', async () => {
    const moduleRef = await Test.createTestingModule({
      imports: [IdempotencyModule.forRoot({ store: new MemoryIdempotencyStore() })],
      controllers: [PaymentsController],
    }).compile();
    const app = moduleRef.createNestApplication({ logger: false });
    const document = SwaggerModule.createDocument(app, new DocumentBuilder().build());
    const operation = document.paths['/payments'].post!;
    expect(operation.parameters).toContainEqual(
      expect.objectContaining({
        name: 'Idempotency-Key',
        in: 'header',
        required: true,
        schema: expect.objectContaining({ maxLength: 255 }),
      }),
    );
    expect(Object.keys(operation.responses)).toEqual(expect.arrayContaining(['400', '409', '422', '503']));
    await app.close();
  });
});
