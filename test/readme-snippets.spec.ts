import { describe, expect, it } from '@jest/globals';
import { mkdirSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { dirname, join, relative } from 'node:path';
import { fileURLToPath } from 'node:url';
import ts from 'typescript';

/**
 * The library README's copy-paste snippets compile against the library as it is, so they cannot
 * rot. A snippet is a ```ts block right after a `<!-- compiled: group/file.ts -->` line; the files
 * of one group are one small app (they may import each other with `./file.js`).
 */
const ROOT = fileURLToPath(new URL('..', import.meta.url));
const README = join(ROOT, 'libs/idempotency/README.md');
const OUT = join(ROOT, '.test-logs/readme-snippets');
const MARKER = /^<!-- compiled: ([\w-]+\/[\w.-]+\.ts) -->$/;

/** The snippets users are told to copy; each must stay marked (and so compiled). */
const EXPECTED = [
  'quick-start/app.module.ts',
  'quick-start/payments.controller.ts',
  'health/health.controller.ts',
  'metrics/metrics.controller.ts',
  'passport/app.module.ts',
  'subclass/auth.module.ts',
  'subclass/jwt-idempotency.interceptor.ts',
  'subclass/app.module.ts',
  'events/idempotency-audit.ts',
  'operator/idempotency-admin.controller.ts',
  'local-cache/app.module.ts',
];

interface Snippet {
  file: string;
  line: number;
  code: string;
}

function readSnippets(markdown: string): Snippet[] {
  const lines = markdown.split('\n');
  const snippets: Snippet[] = [];
  lines.forEach((text, index) => {
    const marker = MARKER.exec(text.trim());
    if (!marker) return;
    const fence = lines[index + 1]?.trim();
    if (fence !== '```ts') throw new Error(`README line ${index + 1}: a compiled marker must be followed by a \`\`\`ts block`);
    const end = lines.findIndex((line, at) => at > index + 1 && line.trim() === '```');
    snippets.push({ file: marker[1], line: index + 3, code: lines.slice(index + 2, end).join('\n') + '\n' });
  });
  return snippets;
}

/** The members of an exported interface of `src/idempotency.options.ts`. */
function optionNames(interfaceName: string): string[] {
  const path = join(ROOT, 'libs/idempotency/src/idempotency.options.ts');
  const source = ts.createSourceFile(path, readFileSync(path, 'utf8'), ts.ScriptTarget.ES2023);
  const found = source.statements.find((node): node is ts.InterfaceDeclaration => ts.isInterfaceDeclaration(node) && node.name.text === interfaceName);
  if (!found) throw new Error(`${interfaceName} is not in idempotency.options.ts`);
  return found.members.flatMap((member) => (member.name && ts.isIdentifier(member.name) ? [member.name.text] : []));
}

describe("the library README's Options section", () => {
  const readme = readFileSync(README, 'utf8');
  const section = readme.slice(readme.indexOf('\n## Options'), readme.indexOf('\n## ', readme.indexOf('\n## Options') + 1));
  const rows = new Set([...section.matchAll(/^\| `(\w+)` \|/gm)].map((match) => match[1]));

  it("has a row for every module option (and forRoot's extras, isGlobal and interceptor)", () => {
    const missing = [...optionNames('IdempotencyModuleOptions'), 'isGlobal', 'interceptor'].filter((name) => !rows.has(name));
    expect(missing).toEqual([]);
  });

  it('names every @NoRepeatSubmit option', () => {
    const missing = optionNames('NoRepeatSubmitOptions').filter((name) => !new RegExp(`\`${name}[\`(]`).test(section));
    expect(missing).toEqual([]);
  });
});

describe("the library README's snippets", () => {
  const snippets = readSnippets(readFileSync(README, 'utf8'));

  it('mark every snippet users are told to copy', () => {
    expect(snippets.map((snippet) => snippet.file)).toEqual(expect.arrayContaining(EXPECTED));
    expect(new Set(snippets.map((snippet) => snippet.file)).size).toBe(snippets.length);
  });

  it('type-check against the library', () => {
    rmSync(OUT, { recursive: true, force: true });
    const where = new Map<string, Snippet>();
    for (const snippet of snippets) {
      const path = join(OUT, snippet.file);
      mkdirSync(dirname(path), { recursive: true });
      writeFileSync(path, snippet.code);
      where.set(path, snippet);
    }
    const config = ts.readConfigFile(join(ROOT, 'tsconfig.json'), ts.sys.readFile).config as object;
    const { options } = ts.parseJsonConfigFileContent(config, ts.sys, ROOT);
    const program = ts.createProgram([...where.keys()], { ...options, noEmit: true, noUnusedLocals: false });
    const problems = ts.getPreEmitDiagnostics(program).map((diagnostic) => {
      const text = ts.flattenDiagnosticMessageText(diagnostic.messageText, '\n');
      const snippet = diagnostic.file && where.get(diagnostic.file.fileName);
      if (!diagnostic.file || diagnostic.start === undefined) return text;
      const { line } = diagnostic.file.getLineAndCharacterOfPosition(diagnostic.start);
      const place = snippet ? `README line ${snippet.line + line} (${snippet.file})` : relative(ROOT, diagnostic.file.fileName);
      return `${place}: ${text}`;
    });
    expect(problems).toEqual([]);
  }, 120_000);
});
