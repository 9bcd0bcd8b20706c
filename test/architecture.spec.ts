import { describe, expect, it } from '@jest/globals';
import { readdirSync, readFileSync, statSync } from 'node:fs';
import { dirname, join, relative, resolve } from 'node:path';

/**
 * The house rules that imports can break, checked on the sources: no import cycle in the
 * libraries (type-only imports count: a cycle of types is still two files that need each other);
 * each published entry's folder reaches another entry only through that entry's index; and the
 * demo, which users copy, imports the libraries only by package name and published entry.
 */
const ROOT = resolve(import.meta.dirname, '..');
const LIBS = join(ROOT, 'libs');
const APPS = join(ROOT, 'apps');
const LIB_SRC = join(LIBS, 'idempotency/src');

/** The library's published entries (`package.json` `exports`): subpath → folder of its sources. */
const ENTRY_FOLDERS = new Map([
  ['typeorm', join(LIB_SRC, 'typeorm')],
  ['health', join(LIB_SRC, 'health')],
  ['testing', join(LIB_SRC, 'testing')],
]);
const MAIN_INDEX = join(LIB_SRC, 'index.ts');

/** What the packages publish, as the specifiers an app writes. */
const PUBLISHED_SPECIFIERS = new Set(
  ['libs/idempotency', 'libs/idempotency-client'].flatMap((lib) => {
    const manifest = JSON.parse(readFileSync(join(ROOT, lib, 'package.json'), 'utf8')) as { name: string; exports: Record<string, unknown> };
    return Object.keys(manifest.exports)
      .filter((subpath) => subpath !== './package.json')
      .map((subpath) => (subpath === '.' ? manifest.name : `${manifest.name}/${subpath.slice(2)}`));
  }),
);
const LIBRARY_PACKAGE = /^nestjs-idempotency(?:-client)?(?:\/|$)/;

function sourcesUnder(dir: string): string[] {
  return readdirSync(dir).flatMap((name) => {
    const path = join(dir, name);
    if (statSync(path).isDirectory()) return name === 'node_modules' ? [] : sourcesUnder(path);
    return path.endsWith('.ts') && !path.endsWith('.spec.ts') ? [path] : [];
  });
}

/** `import ... from`, `export ... from`, a bare `import '...'` and `import('...')`. */
const IMPORT = /(?:import|export)\s[^'";]*?from\s+'([^']+)'|import\s*\(?\s*'([^']+)'/g;

/** Every specifier a source imports. */
function specifiersIn(source: string): string[] {
  return [...source.matchAll(IMPORT)].map((match) => match[1] ?? match[2]);
}

/** The project files a source file imports by relative path (`.js` specifiers name `.ts` files). */
function importsOf(file: string, source = readFileSync(file, 'utf8')): string[] {
  return specifiersIn(source)
    .filter((specifier) => specifier.startsWith('.'))
    .map((specifier) => resolve(dirname(file), specifier.replace(/\.js$/, '.ts')));
}

/** The entry folder a library file belongs to (`undefined`: the main entry). */
const entryOf = (file: string) => [...ENTRY_FOLDERS.values()].find((folder) => file.startsWith(folder + '/'));

/** Imports that cross from one entry into another's internals (anything but its index). */
function crossEntryImports(file: string, source?: string): string[] {
  const from = entryOf(file);
  return importsOf(file, source)
    .filter((to) => to.startsWith(LIB_SRC + '/') && entryOf(to) !== from)
    .filter((to) => (entryOf(to) === undefined ? to !== MAIN_INDEX : to !== join(entryOf(to)!, 'index.ts')))
    .map((to) => `${relative(ROOT, file)} imports ${relative(ROOT, to)}`);
}

/** What a demo file imports of the libraries other than their published entries, by package name. */
function unpublishedImports(file: string, source = readFileSync(file, 'utf8')): string[] {
  const relativeIntoLibs = importsOf(file, source).filter((to) => to.startsWith(LIBS + '/'));
  const unpublished = specifiersIn(source).filter((specifier) => LIBRARY_PACKAGE.test(specifier) && !PUBLISHED_SPECIFIERS.has(specifier));
  return [...relativeIntoLibs.map((to) => relative(ROOT, to)), ...unpublished].map((what) => `${relative(ROOT, file)} imports ${what}`);
}

function importGraph(files: string[]): Map<string, string[]> {
  return new Map(files.map((file) => [file, importsOf(file).filter((to) => files.includes(to))]));
}

/** Every cycle a depth-first walk meets, as `a -> b -> a` (paths relative to the repository). */
function cyclesIn(graph: Map<string, string[]>): string[] {
  const cycles: string[] = [];
  const state = new Map<string, 'open' | 'done'>();
  const path: string[] = [];
  const visit = (file: string) => {
    state.set(file, 'open');
    path.push(file);
    for (const to of graph.get(file) ?? []) {
      if (state.get(to) === 'open') cycles.push([...path.slice(path.indexOf(to)), to].map((p) => relative(ROOT, p)).join(' -> '));
      else if (!state.has(to)) visit(to);
    }
    path.pop();
    state.set(file, 'done');
  };
  for (const file of graph.keys()) if (!state.has(file)) visit(file);
  return cycles;
}

describe('the house', () => {
  it('has no import cycle in libs/', () => {
    const files = sourcesUnder(LIBS);
    expect(cyclesIn(importGraph(files))).toEqual([]);
  });

  it('finds a cycle when there is one, type-only imports included (the check can fail)', () => {
    const [a, b, c] = ['a.ts', 'b.ts', 'c.ts'].map((name) => join(ROOT, name));
    expect(cyclesIn(new Map([[a, [b]], [b, [c]], [c, [a]]]))).toEqual(['a.ts -> b.ts -> c.ts -> a.ts']);
    // The guard's interceptor imports a type of the decorator's seam: seen as an import.
    const interceptor = join(LIBS, 'idempotency/src/interceptors/idempotency.interceptor.ts');
    expect(importsOf(interceptor)).toContain(join(LIBS, 'idempotency/src/decorators/no-repeat-submit.metadata.ts'));
  });

  it("keeps each published entry's folder out of the other entries' internals", () => {
    const crossing = sourcesUnder(LIB_SRC).flatMap((file) => crossEntryImports(file));
    expect(crossing).toEqual([]);
  });

  it('finds an import across entries when there is one (the check can fail)', () => {
    const store = join(LIB_SRC, 'typeorm/store/postgres-idempotency.store.ts');
    expect(crossEntryImports(store, "import { IdempotencyStore } from '../../stores/idempotency-store.js';")).toEqual([
      'libs/idempotency/src/typeorm/store/postgres-idempotency.store.ts imports libs/idempotency/src/stores/idempotency-store.ts',
    ]);
    expect(crossEntryImports(store, "import { IdempotencyStore } from '../../index.js';")).toEqual([]);
    const module = join(LIB_SRC, 'idempotency.module.ts');
    expect(crossEntryImports(module, "import { recordKey } from './typeorm/store/record-key.js';")).toHaveLength(1);
  });

  it('lets the demo import the libraries only by package name, through their published entries', () => {
    expect([...PUBLISHED_SPECIFIERS].sort()).toEqual([
      'nestjs-idempotency',
      'nestjs-idempotency-client',
      'nestjs-idempotency/health',
      'nestjs-idempotency/testing',
      'nestjs-idempotency/typeorm',
    ]);
    const deep = sourcesUnder(APPS).flatMap((file) => unpublishedImports(file));
    expect(deep).toEqual([]);
  });

  it('finds a deep import in the demo when there is one (the check can fail)', () => {
    const demo = join(APPS, 'demo/src/app.module.ts');
    expect(unpublishedImports(demo, "import { IdempotencyStore } from 'nestjs-idempotency/stores/idempotency-store.js';")).toHaveLength(1);
    expect(unpublishedImports(demo, "import { IdempotencyModule } from '../../../libs/idempotency/src/index.js';")).toHaveLength(1);
    expect(unpublishedImports(demo, "import { IdempotencyModule } from 'nestjs-idempotency';")).toEqual([]);
  });
});
