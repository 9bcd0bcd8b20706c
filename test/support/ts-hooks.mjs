// Node module hooks that run the TypeScript sources directly (SWC, same settings as Jest), so
// that tests can start the demo as real child processes without a build step.
import { transformSync } from '@swc/core';
import { existsSync, readFileSync } from 'node:fs';
import { fileURLToPath } from 'node:url';

const SWC = {
  jsc: {
    parser: { syntax: 'typescript', decorators: true },
    transform: { legacyDecorator: true, decoratorMetadata: true, useDefineForClassFields: false },
    target: 'es2023',
  },
  module: { type: 'es6' },
  sourceMaps: 'inline',
};

/** The libraries by package name, as the demo imports them (the TypeScript `paths` of tsconfig.json). */
const PACKAGES = {
  'nestjs-idempotency': 'libs/idempotency/src/index.ts',
  'nestjs-idempotency/typeorm': 'libs/idempotency/src/typeorm/index.ts',
  'nestjs-idempotency/health': 'libs/idempotency/src/health/index.ts',
  'nestjs-idempotency/testing': 'libs/idempotency/src/testing/index.ts',
  'nestjs-idempotency-client': 'libs/idempotency-client/src/index.ts',
};
const ROOT = new URL('../../', import.meta.url);

export async function resolve(specifier, context, next) {
  if (Object.hasOwn(PACKAGES, specifier)) return { url: new URL(PACKAGES[specifier], ROOT).href, format: 'module', shortCircuit: true };
  const relative = specifier.startsWith('.') || specifier.startsWith('/') || specifier.startsWith('file:');
  if (relative && specifier.endsWith('.js') && context.parentURL?.endsWith('.ts')) {
    const ts = new URL(specifier.replace(/\.js$/, '.ts'), context.parentURL);
    if (existsSync(fileURLToPath(ts))) return { url: ts.href, format: 'module', shortCircuit: true };
  }
  return next(specifier, context);
}

export async function load(url, context, next) {
  if (!url.endsWith('.ts')) return next(url, context);
  const filename = fileURLToPath(url);
  const { code } = transformSync(readFileSync(filename, 'utf8'), { ...SWC, filename });
  return { format: 'module', source: code, shortCircuit: true };
}
