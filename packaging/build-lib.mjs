#!/usr/bin/env node
// Builds the publishable packages: `node packaging/build-lib.mjs [lib...] [--pack]`.
// For each lib (default: every libs/<lib> with a package.json): compiles libs/<lib>/src with
// libs/<lib>/tsconfig.build.json into dist/packages/<name>/dist, copies the manifest and README,
// checks the package (see check-package.mjs), and with --pack writes dist/packages/<name>-<version>.tgz.
import { execFileSync } from 'node:child_process';
import { copyFileSync, existsSync, mkdirSync, readdirSync, readFileSync, rmSync, writeFileSync } from 'node:fs';
import { basename, join, relative } from 'node:path';
import { fileURLToPath } from 'node:url';
import { checkPackage } from './check-package.mjs';

const ROOT = fileURLToPath(new URL('..', import.meta.url));
const OUT = join(ROOT, 'dist', 'packages');
const TSC = join(ROOT, 'node_modules', 'typescript', 'bin', 'tsc');

const args = process.argv.slice(2);
const pack = args.includes('--pack');
const named = args.filter((arg) => !arg.startsWith('--'));
const libs = named.length > 0 ? named : readdirSync(join(ROOT, 'libs')).filter((lib) => existsSync(join(ROOT, 'libs', lib, 'package.json')));

/**
 * The README as published: its links to the repository's other files lead nowhere from the
 * package (npm and an installed node_modules hold this file alone). A link to another package's
 * README goes to that package's npm page; one to any other file becomes its path in the repository.
 */
function publishedReadme(text) {
  return text.replace(/\[([^\]]+)\]\((\.\.\/[^)\s]+)\)/g, (_link, label, target) => {
    const [path] = target.split('#');
    const lib = /^\.\.\/([^/]+)\/README\.md$/.exec(path);
    const name = lib && existsSync(join(ROOT, 'libs', lib[1], 'package.json')) && JSON.parse(readFileSync(join(ROOT, 'libs', lib[1], 'package.json'), 'utf8')).name;
    if (name) return `[${label}](https://www.npmjs.com/package/${name})`;
    const file = relative(ROOT, join(ROOT, 'libs', 'x', path));
    return label.replaceAll('`', '') === basename(file) ? `\`${file}\`` : `${label} (\`${file}\`)`;
  });
}

let failed = false;
for (const lib of libs) {
  const libDir = join(ROOT, 'libs', lib);
  const manifest = JSON.parse(readFileSync(join(libDir, 'package.json'), 'utf8'));
  const stage = join(OUT, manifest.name);
  rmSync(stage, { recursive: true, force: true });
  mkdirSync(stage, { recursive: true });

  execFileSync(process.execPath, [TSC, '-p', join(libDir, 'tsconfig.build.json'), '--outDir', join(stage, 'dist')], {
    cwd: ROOT,
    stdio: 'inherit',
  });
  copyFileSync(join(libDir, 'package.json'), join(stage, 'package.json'));
  for (const file of ['LICENSE', 'CHANGELOG.md']) {
    if (existsSync(join(libDir, file))) copyFileSync(join(libDir, file), join(stage, file));
  }
  if (existsSync(join(libDir, 'README.md'))) writeFileSync(join(stage, 'README.md'), publishedReadme(readFileSync(join(libDir, 'README.md'), 'utf8')));

  const problems = checkPackage(stage);
  if (problems.length > 0) {
    failed = true;
    console.error(`\n${manifest.name}: the package is not publishable:\n${problems.map((p) => `  - ${p}`).join('\n')}\n`);
    continue;
  }
  if (pack) {
    const [{ filename, size, entryCount }] = JSON.parse(
      execFileSync('npm', ['pack', '--json', '--pack-destination', OUT], { cwd: stage, encoding: 'utf8' }),
    );
    console.log(`${manifest.name}: ${relative(ROOT, join(OUT, filename))} (${entryCount} files, ${size} bytes)`);
  } else {
    console.log(`${manifest.name}: built in ${relative(ROOT, stage)}`);
  }
}
process.exit(failed ? 1 : 0);
