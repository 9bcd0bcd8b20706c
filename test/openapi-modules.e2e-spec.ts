// The OpenAPI document of guarded routes, per module and per app (helper-202): each route was
// documented once per process, with the options of the first IdempotencyModule that started. A
// feature module with its own `keyHeader` (isGlobal: false) had its routes documented with the
// root's `Idempotency-Key` (a client sending it got 400), the root's with the feature's; a second
// app of the process, with other options, showed the first app's.
import { describe, expect, it } from '@jest/globals';
import { Body, Controller, Module, Post, type DynamicModule, type INestApplication } from '@nestjs/common';
import { NestFactory } from '@nestjs/core';
import { DocumentBuilder, SwaggerModule, type OpenAPIObject } from '@nestjs/swagger';
import { IdempotencyModule, MemoryIdempotencyStore, NoRepeatSubmit, type IdempotencyModuleOptions } from '../libs/idempotency/src/index.js';

@Controller('orders')
class OrdersController {
  @Post()
  @NoRepeatSubmit()
  create(@Body() body: unknown) {
    return body;
  }
}

@Controller('partner')
class PartnerController {
  @Post()
  @NoRepeatSubmit()
  create(@Body() body: unknown) {
    return body;
  }
}

@Module({
  imports: [IdempotencyModule.forRoot({ isGlobal: false, store: new MemoryIdempotencyStore(), keyHeader: 'X-Partner-Key', errorFormat: 'problem+json', failMode: 'closed' })],
  controllers: [PartnerController],
})
class PartnerModule {}

@Controller('feature')
class FeatureController {
  @Post()
  @NoRepeatSubmit()
  create(@Body() body: unknown) {
    return body;
  }
}

/** A shared module that imports its own IdempotencyModule and exports it to the modules that import it. */
const featureGuard = IdempotencyModule.forRoot({ isGlobal: false, store: new MemoryIdempotencyStore(), keyHeader: 'X-Feature-Key' });
@Module({ imports: [featureGuard], exports: [featureGuard] })
class SharedGuardModule {}

@Module({ imports: [SharedGuardModule], controllers: [FeatureController] })
class FeatureModule {}

async function documentOf(imports: (DynamicModule | typeof PartnerModule | typeof FeatureModule)[], controllers: (typeof OrdersController)[]): Promise<OpenAPIObject> {
  @Module({ imports, controllers })
  class AppModule {}
  const app: INestApplication = await NestFactory.create(AppModule, { logger: false });
  try {
    await app.init();
    return SwaggerModule.createDocument(app, new DocumentBuilder().build());
  } finally {
    await app.close();
  }
}

/** The key header the operation documents, and the media type of its 409. */
function keyAndFormat(document: OpenAPIObject, path: string): { header?: string; conflict: string[] } {
  const operation = document.paths[path]!.post!;
  const header = (operation.parameters ?? []).find((parameter) => 'in' in parameter && parameter.in === 'header') as { name: string } | undefined;
  const conflict = (operation.responses['409'] as { content?: Record<string, unknown> }).content ?? {};
  return { header: header?.name, conflict: Object.keys(conflict) };
}

const root = (options: IdempotencyModuleOptions = {}) => IdempotencyModule.forRoot({ store: new MemoryIdempotencyStore(), ...options });

describe('the OpenAPI document of guarded routes, per module and app', () => {
  it("documents each route with its own module's key header and error format", async () => {
    const document = await documentOf([root(), PartnerModule], [OrdersController]);
    expect([keyAndFormat(document, '/orders'), keyAndFormat(document, '/partner')]).toEqual([
      { header: 'Idempotency-Key', conflict: ['application/json'] },
      { header: 'X-Partner-Key', conflict: ['application/problem+json'] },
    ]);
    expect((document.paths['/partner']!.post!.responses['503'] as { description: string }).description).toContain('unreachable');
  });

  // helper-204: the module that re-exports the guard's was passed over for the global one.
  it('documents a route guarded through a re-exported module with that module\'s key header', async () => {
    const document = await documentOf([root(), FeatureModule], [OrdersController]);
    expect([keyAndFormat(document, '/orders').header, keyAndFormat(document, '/feature').header]).toEqual(['Idempotency-Key', 'X-Feature-Key']);
  });

  it("documents a later app's routes with that app's options", async () => {
    const first = await documentOf([root({ keyHeader: 'X-Request-Key', errorFormat: 'problem+json' })], [OrdersController]);
    const second = await documentOf([root()], [OrdersController]);
    expect([keyAndFormat(first, '/orders'), keyAndFormat(second, '/orders')]).toEqual([
      { header: 'X-Request-Key', conflict: ['application/problem+json'] },
      { header: 'Idempotency-Key', conflict: ['application/json'] },
    ]);
    // Documented again, not twice: one key header parameter.
    expect((second.paths['/orders']!.post!.parameters ?? []).filter((parameter) => 'in' in parameter && parameter.in === 'header')).toHaveLength(1);
  });
});
