import { describe, expect, it } from '@jest/globals';
import { readdirSync, readFileSync, statSync } from 'node:fs';
import { dirname, join, relative, resolve } from 'node:path';

/**
 * The house rules that imports can break, checked on the sources: no import cycle in the
 * libraries (type-only imports count: a cycle of types is still two files that need each other),
 * and the demo, which users copy, imports the libraries only through their published entries.
 */
const ROOT = resolve(import.meta.dirname, '..');
const LIBS = join(ROOT, 'libs');
const APPS = join(ROOT, 'apps');

/** What `package.json` `exports` publishes, as source files. */
const PUBLISHED = new Set(
  [
    'libs/idempotency/src/index.ts',
    'libs/idempotency/src/typeorm.ts',
    'libs/idempotency/src/health/index.ts',
    'libs/idempotency-client/src/index.ts',
  ].map((path) => join(ROOT, path)),
);

function sourcesUnder(dir: string): string[] {
  return readdirSync(dir).flatMap((name) => {
    const path = join(dir, name);
    if (statSync(path).isDirectory()) return name === 'node_modules' ? [] : sourcesUnder(path);
    return path.endsWith('.ts') && !path.endsWith('.spec.ts') ? [path] : [];
  });
}

/** `import ... from`, `export ... from`, a bare `import '...'` and `import('...')`. */
const RELATIVE_IMPORT = /(?:import|export)\s[^'";]*?from\s+'(\.[^']+)'|import\s*\(?\s*'(\.[^']+)'/g;

/** The project files a source file imports by relative path (`.js` specifiers name `.ts` files). */
function importsOf(file: string): string[] {
  const source = readFileSync(file, 'utf8');
  return [...source.matchAll(RELATIVE_IMPORT)].map((match) => resolve(dirname(file), (match[1] ?? match[2]).replace(/\.js$/, '.ts')));
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
    // The store contract suite is test code under src/ (it imports @jest/globals): not the library.
    const files = sourcesUnder(LIBS).filter((file) => !file.endsWith('store-contract.ts'));
    expect(cyclesIn(importGraph(files))).toEqual([]);
  });

  it('finds a cycle when there is one, type-only imports included (the check can fail)', () => {
    const [a, b, c] = ['a.ts', 'b.ts', 'c.ts'].map((name) => join(ROOT, name));
    expect(cyclesIn(new Map([[a, [b]], [b, [c]], [c, [a]]]))).toEqual(['a.ts -> b.ts -> c.ts -> a.ts']);
    // The guard's interceptor imports a type of the decorator's seam: seen as an import.
    const interceptor = join(LIBS, 'idempotency/src/interceptors/idempotency.interceptor.ts');
    expect(importsOf(interceptor)).toContain(join(LIBS, 'idempotency/src/decorators/no-repeat-submit.metadata.ts'));
  });

  it('lets the demo import the libraries only through their published entries', () => {
    const deep = sourcesUnder(APPS).flatMap((file) =>
      importsOf(file)
        .filter((to) => to.startsWith(LIBS + '/') && !PUBLISHED.has(to))
        .map((to) => `${relative(ROOT, file)} imports ${relative(ROOT, to)}`),
    );
    expect(deep).toEqual([]);
  });
});
