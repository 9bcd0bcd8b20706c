// A user's app in a fresh folder outside the monorepo, with the packed nestjs-idempotency installed
// by a plain `npm install` from its tarball, the app's own TypeScript and the app's own Node
// modules: what `npm publish` would hand a user, with nothing of the monorepo's around it.
import { execFile } from 'node:child_process';
import { readFileSync } from 'node:fs';
import { cp, mkdtemp, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { promisify } from 'node:util';

const exec = promisify(execFile);
const ROOT = fileURLToPath(new URL('../..', import.meta.url));

/**
 * The environment without the variables `npm test` sets for the monorepo (its prefix, its package).
 * `npm_config_cache` stays: npm's cache (by default ~/.npm) is what makes a second run fast, with
 * `--prefer-offline` and exact versions.
 */
export const npmEnv = (): NodeJS.ProcessEnv =>
  Object.fromEntries(Object.entries(process.env).filter(([name]) => !/^npm_(?!config_cache$)/i.test(name)));

/** Builds and packs the library as it is published (packaging/build-lib.mjs); returns the tarball. */
export async function packLibrary(): Promise<string> {
  await exec(process.execPath, ['packaging/build-lib.mjs', 'idempotency', '--pack'], { cwd: ROOT });
  const { name, version } = JSON.parse(readFileSync(join(ROOT, 'libs/idempotency/package.json'), 'utf8')) as { name: string; version: string };
  return join(ROOT, 'dist', 'packages', `${name}-${version}.tgz`);
}

export interface AppRecipe {
  /** `"module"` or `"commonjs"`: the app's package.json `type`. */
  type: 'module' | 'commonjs';
  /** Exact versions. */
  dependencies: Record<string, string>;
  /** Exact versions: `typescript` (the app compiles with its own) and `@types/node`. */
  devDependencies: Record<string, string>;
  /** The module options of the app's tsconfig (the rest is Nest's usual set). */
  compilerOptions: Record<string, string>;
}

export interface PackedApp {
  dir: string;
  /** What `npm install` wrote to stderr (warnings). */
  installWarnings: string;
  /** `tsc -p tsconfig.json` with the app's own compiler; rejects with the compiler's output. */
  build(): Promise<void>;
  /** `node dist/main.js`; resolves with its stdout. */
  run(env: Record<string, string>): Promise<string>;
  remove(): Promise<void>;
}

/** Creates the app from packaging/reach-app and installs it with `npm install`, the library from `tarball`. */
export async function installPackedApp(recipe: AppRecipe, tarball: string): Promise<PackedApp> {
  const dir = await mkdtemp(join(tmpdir(), `nestjs-idempotency-${recipe.type}-app-`));
  await cp(join(ROOT, 'packaging', 'reach-app'), dir, { recursive: true });
  await writeFile(
    join(dir, 'package.json'),
    JSON.stringify({
      name: `reach-${recipe.type}-app`,
      private: true,
      type: recipe.type,
      dependencies: { ...recipe.dependencies, 'nestjs-idempotency': `file:${tarball}` },
      devDependencies: recipe.devDependencies,
    }),
  );
  await writeFile(
    join(dir, 'tsconfig.json'),
    JSON.stringify({
      compilerOptions: {
        ...recipe.compilerOptions,
        target: 'ES2023', lib: ['ES2023'], strict: true, experimentalDecorators: true, emitDecoratorMetadata: true,
        skipLibCheck: true, rootDir: 'src', outDir: 'dist', types: ['node'],
      },
      include: ['src'],
    }),
  );
  // Plain `npm install`: no --legacy-peer-deps, no overrides. `=false` so a machine's npmrc cannot relax it.
  const { stderr } = await exec('npm', ['install', '--no-audit', '--no-fund', '--prefer-offline', '--ignore-scripts', '--legacy-peer-deps=false', '--loglevel=warn'], {
    cwd: dir,
    env: npmEnv(),
  }).catch(async (error: unknown) => {
    await rm(dir, { recursive: true, force: true });
    throw error;
  });
  const node = (args: string[], env: Record<string, string> = {}) =>
    exec(process.execPath, args, { cwd: dir, env: { ...npmEnv(), ...env }, timeout: 60_000 });
  return {
    dir,
    installWarnings: stderr,
    build: () =>
      node(['node_modules/typescript/bin/tsc', '-p', 'tsconfig.json']).then(
        () => undefined,
        (error: { stdout: string }) => Promise.reject(new Error(`tsc failed in ${dir}:\n${error.stdout}`)),
      ),
    run: async (env) => (await node(['dist/main.js'], env)).stdout,
    remove: () => rm(dir, { recursive: true, force: true }),
  };
}
