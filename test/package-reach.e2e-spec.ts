// Issue #14, "Reach": the packed package installs with a plain `npm install` in the apps users have,
// a Nest 12 ES-module app and a Nest 11 CommonJS app (which loads the ESM-only package through
// Node's require(esm)), each type-checks with its own TypeScript (the CommonJS one under
// `moduleResolution: node`, which ignores `exports`: `typesVersions` serves the subpath entries)
// and runs a POST twice through the guard on the real Redis. The app is packaging/reach-app.
//
// Both apps use ioredis 5: typeorm 1.1.1 declares an optional peer `ioredis@^5.0.4`, so no plain
// `npm install` puts it next to ioredis 6, whatever this package declares. Nest 12 with ioredis 6
// is package.e2e-spec.ts. Here: ioredis 5.3.0 (the lowest this package accepts: the first with a
// runtime `Redis` export) and 5.11.1 (the latest 5.x). Nest 11 with its latest 11.x of everything.
import { afterAll, beforeAll, describe, expect, it } from '@jest/globals';
import { installPackedApp, packLibrary, type AppRecipe, type PackedApp } from './support/packed-app.js';
import { REDIS_URL } from './support/services.js';

const NODE_TYPES = { '@types/node': '20.19.43' };
const APPS: (AppRecipe & { name: string })[] = [
  {
    name: 'a Nest 12 ES-module app (module nodenext, TypeScript 6.0)',
    type: 'module',
    dependencies: {
      '@nestjs/common': '12.5.1', '@nestjs/core': '12.5.1', '@nestjs/platform-express': '12.5.1',
      '@nestjs/swagger': '12.0.2', '@nestjs/terminus': '12.1.0',
      typeorm: '1.1.1', ioredis: '5.3.0', 'reflect-metadata': '0.2.2', rxjs: '7.8.2',
    },
    devDependencies: { typescript: '6.0.3', ...NODE_TYPES },
    compilerOptions: { module: 'nodenext', moduleResolution: 'nodenext' },
  },
  {
    name: 'a Nest 11 CommonJS app (module commonjs, moduleResolution node, TypeScript 5.9)',
    type: 'commonjs',
    dependencies: {
      '@nestjs/common': '11.2.10', '@nestjs/core': '11.2.10', '@nestjs/platform-express': '11.2.10',
      '@nestjs/swagger': '11.4.7', '@nestjs/terminus': '11.1.1',
      typeorm: '1.1.1', ioredis: '5.11.1', 'reflect-metadata': '0.2.2', rxjs: '7.8.2',
    },
    devDependencies: { typescript: '5.9.3', ...NODE_TYPES },
    compilerOptions: { module: 'commonjs', moduleResolution: 'node' },
  },
];

describe('the packed nestjs-idempotency in the apps users have', () => {
  let tarball: string;
  beforeAll(async () => {
    tarball = await packLibrary();
  }, 180_000);

  describe.each(APPS)('$name', (recipe) => {
    let app: PackedApp;
    beforeAll(async () => {
      app = await installPackedApp(recipe, tarball);
    }, 300_000);
    afterAll(async () => {
      await app?.remove();
    });

    it('installs with a plain npm install, without a peer conflict', () => {
      expect(app.installWarnings).not.toMatch(/ERESOLVE|peer dep/i);
    });

    it("type-checks with the app's own TypeScript: the main entry, /health and /typeorm", async () => {
      await app.build();
    }, 120_000);

    it('runs two identical POSTs through the guard on Redis: the handler ran once, the second was replayed', async () => {
      const stdout = await app.run({ REDIS_URL, KEY_PREFIX: `package-reach-${recipe.type}-${process.pid}-${Date.now()}` });
      expect(JSON.parse(stdout)).toEqual({
        moduleSystem: recipe.type,
        first: { status: 201, replayed: null, body: { amount: 5, run: 1 } },
        second: { status: 201, replayed: 'true', body: { amount: 5, run: 1 } },
        runs: 1,
        health: 'up', // nestjs-idempotency/health with this app's @nestjs/terminus
        keyHeader: true, // the guarded route's OpenAPI names the Idempotency-Key header (this app's @nestjs/swagger)
        entities: true, // nestjs-idempotency/typeorm's entities are in this app's typeorm
      });
    }, 60_000);
  });
});
