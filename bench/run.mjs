#!/usr/bin/env node
// `npm run bench`: installs bench/peers when its node_modules is missing (npm ci, its own lockfile
// and .npmrc with legacy-peer-deps, so the project's own install stays strict), compiles the
// library and the bench with the project's tsc (bench/tsconfig.json, into dist/), then runs the
// phases. Arguments and BENCH_* variables pass through (see bench/README.md).
import { spawnSync } from 'node:child_process';
import { existsSync } from 'node:fs';
import { dirname, join } from 'node:path';
import { fileURLToPath, pathToFileURL } from 'node:url';

const root = join(dirname(fileURLToPath(import.meta.url)), '..');
const peers = join(root, 'bench', 'peers');

function run(command, args, cwd) {
  const result = spawnSync(command, args, { cwd, stdio: 'inherit' });
  if (result.status !== 0) {
    console.error(`bench: ${command} ${args.join(' ')} failed (${result.status ?? result.signal})`);
    process.exit(1);
  }
}

if (!existsSync(join(peers, 'node_modules', '.package-lock.json'))) {
  console.error('bench: installing bench/peers (npm ci, legacy-peer-deps)');
  run('npm', ['ci', '--no-audit', '--no-fund'], peers);
}
console.error('bench: compiling libs and bench (tsc -p bench/tsconfig.json)');
run(process.execPath, [join(root, 'node_modules', 'typescript', 'bin', 'tsc'), '-p', join(root, 'bench', 'tsconfig.json')], root);

const script = process.argv[2] === 'fingerprint' ? 'micro/fingerprint.bench.js' : 'main.js';
if (script !== 'main.js') process.argv.splice(2, 1);
process.argv[1] = join(root, 'dist', 'bench', 'src', script);
await import(pathToFileURL(process.argv[1]).href);
