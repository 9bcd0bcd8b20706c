import { afterAll, beforeAll, describe, expect, it } from '@jest/globals';
import { execFile } from 'node:child_process';
import { existsSync, readFileSync } from 'node:fs';
import { cp, mkdtemp, readdir, rm, writeFile } from 'node:fs/promises';
import { tmpdir } from 'node:os';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';
import { promisify } from 'node:util';
import { REDIS_URL } from './support/services.js';

const exec = promisify(execFile);
const ROOT = fileURLToPath(new URL('..', import.meta.url));
const PACKAGES = join(ROOT, 'dist', 'packages');
const readJson = (path: string) => JSON.parse(readFileSync(path, 'utf8')) as Record<string, Record<string, unknown>>;
const LIB = readJson(join(ROOT, 'libs', 'idempotency', 'package.json'));
const CLIENT = readJson(join(ROOT, 'libs', 'idempotency-client', 'package.json'));
const ROOT_DEPS = readJson(join(ROOT, 'package.json')).dependencies as Record<string, string>;
const OPTIONAL_PEERS = Object.entries(LIB.peerDependenciesMeta as Record<string, { optional?: boolean }>)
  .filter(([, meta]) => meta.optional)
  .map(([name]) => name);
/** What a user of the Redis store installs: the required peers, an HTTP platform and ioredis (the root's versions). */
const APP_DEPS = ['@nestjs/common', '@nestjs/core', '@nestjs/platform-express', 'reflect-metadata', 'rxjs', 'ioredis'];

/** The environment without the variables `npm test` sets for the monorepo (its prefix, its package). */
const npmEnv = () => Object.fromEntries(Object.entries(process.env).filter(([name]) => !/^npm_(?!config_cache$)/i.test(name)));

describe('the packed nestjs-idempotency, installed in a fresh app outside the monorepo', () => {
  let app: string;
  const node = (args: string[], env: Record<string, string> = {}) =>
    exec(process.execPath, args, { cwd: app, env: { ...npmEnv(), ...env }, timeout: 30_000 });
  const hidingOptionalPeers = { HIDDEN_PACKAGES: OPTIONAL_PEERS.join(',') };

  beforeAll(async () => {
    await exec(process.execPath, ['packaging/build-lib.mjs', 'idempotency', 'idempotency-client', '--pack'], { cwd: ROOT });
    const tarball = (manifest: Record<string, unknown>) => join(PACKAGES, `${manifest.name}-${manifest.version}.tgz`);

    app = await mkdtemp(join(tmpdir(), 'nestjs-idempotency-app-'));
    await cp(join(ROOT, 'packaging', 'smoke-app'), app, { recursive: true });
    const dependencies = Object.fromEntries(APP_DEPS.map((name) => [name, ROOT_DEPS[name]]));
    await writeFile(
      join(app, 'package.json'),
      JSON.stringify({
        name: 'smoke-app',
        private: true,
        type: 'module',
        dependencies: { ...dependencies, [LIB.name as unknown as string]: `file:${tarball(LIB)}`, [CLIENT.name as unknown as string]: `file:${tarball(CLIENT)}` },
      }),
    );
    await exec('npm', ['install', '--no-audit', '--no-fund', '--prefer-offline', '--ignore-scripts', '--loglevel=error'], {
      cwd: app,
      env: npmEnv(),
    });
    // The user's TypeScript build, against the package's declarations (the monorepo's compiler and Node types).
    await writeFile(
      join(app, 'tsconfig.json'),
      JSON.stringify({
        compilerOptions: {
          module: 'nodenext', moduleResolution: 'nodenext', target: 'ES2023', lib: ['ES2023'], strict: true,
          experimentalDecorators: true, emitDecoratorMetadata: true, skipLibCheck: true,
          rootDir: 'src', outDir: 'dist', typeRoots: [join(ROOT, 'node_modules', '@types')], types: ['node'],
        },
        include: ['src'],
      }),
    );
    await node([join(ROOT, 'node_modules', 'typescript', 'bin', 'tsc'), '-p', 'tsconfig.json']);
  }, 180_000);
  afterAll(async () => {
    if (app) await rm(app, { recursive: true, force: true });
  });

  it('ships declarations and built code only, and npm installed none of the optional peers but ioredis', async () => {
    const installed = join(app, 'node_modules', LIB.name as unknown as string);
    const files = (await readdir(join(installed, 'dist'), { recursive: true })).map(String);
    const entries = ['index', 'typeorm/index', 'health/index', 'testing/index'];
    expect(files).toEqual(expect.arrayContaining(entries.flatMap((entry) => [`${entry}.js`, `${entry}.d.ts`])));
    expect(files.filter((file) => /\.spec\./.test(file))).toEqual([]);
    for (const peer of OPTIONAL_PEERS.filter((name) => name !== 'ioredis')) {
      expect({ peer, installed: existsSync(join(app, 'node_modules', peer)) }).toEqual({ peer, installed: false });
    }
  });

  it("links from its README only to what a reader of the package can reach: no link into the repository's files", async () => {
    for (const name of [LIB.name, CLIENT.name] as unknown as string[]) {
      const readme = readFileSync(join(app, 'node_modules', name, 'README.md'), 'utf8');
      expect({ name, relativeLinks: readme.match(/\]\((?!https?:|#)[^)]*\)/g) ?? [] }).toEqual({ name, relativeLinks: [] });
    }
  });

  it('imports the main entry with every optional peer missing', async () => {
    const { stdout } = await node(
      ['--import', './hide-optional-peers.mjs', '--input-type=module', '-e', "const m = await import('nestjs-idempotency'); console.log(typeof m.IdempotencyModule)"],
      hidingOptionalPeers,
    );
    expect(stdout.trim()).toBe('function');
  });

  it.each([
    ['the memory store, every optional peer missing', { ...hidingOptionalPeers }],
    ['Redis from a URL (ioredis loaded when the module opens the client)', { STORE: 'redis', REDIS_URL }],
  ])('runs a POST twice through the guard: the second is replayed (%s)', async (_name, env) => {
    const { stdout } = await node(['dist/main.js'], { KEY_PREFIX: `package-e2e-${process.pid}-${Date.now()}`, ...env });
    const seen = JSON.parse(stdout) as Record<string, unknown>;
    expect(seen).toEqual({
      first: { status: 201, replayed: null, body: { amount: 5, run: 1 } },
      second: { status: 201, replayed: 'true', body: { amount: 5, run: 1 } },
      viaClient: [
        { status: 201, replayed: false, attempts: 1, body: { amount: 6, run: 2 } },
        { status: 201, replayed: true, attempts: 1, body: { amount: 6, run: 2 } },
      ],
    });
  });

  it("types the client error's documented `cause` under a classic Nest tsconfig's ES2021 library", async () => {
    // ES2021's Error has no `cause`: the declarations must say it themselves (an adversarial helper: TS2339).
    await writeFile(
      join(app, 'cause.ts'),
      "import { IdempotentRequestError } from 'nestjs-idempotency-client';\n" +
        'export const causeOf = (error: IdempotentRequestError): unknown => [error.cause, error.key, error.attempts];\n',
    );
    const tsc = join(ROOT, 'node_modules', 'typescript', 'bin', 'tsc');
    const options = ['--ignoreConfig', '--noEmit', '--strict', '--skipLibCheck', '--target', 'ES2021', '--lib', 'ES2021', '--module', 'nodenext', '--moduleResolution', 'nodenext'];
    await expect(node([tsc, ...options, 'cause.ts']).then(() => 'compiled', (error: { stdout: string }) => error.stdout)).resolves.toBe('compiled');
  });

  it.each([LIB.name, CLIENT.name] as unknown as string[])('%s passes `npm publish --dry-run` with no warning but "not logged in"', async (name) => {
    // npm warns here about each field it would auto-correct (`npm pkg fix`), a bad `bin` or `repository`, a missing file.
    const { stderr } = await exec('npm', ['publish', '--dry-run'], { cwd: join(PACKAGES, name), env: npmEnv() });
    expect(stderr.split('\n').filter((line) => /^npm warn/i.test(line) && !/requires you to be logged in/.test(line))).toEqual([]);
  });

  it.each([
    ['the Redis store from a URL, without ioredis', { STORE: 'redis', REDIS_URL, HIDDEN_PACKAGES: 'ioredis' }, 'store: { redis } needs the ioredis package: npm install ioredis'],
    ['metrics: true, without prom-client', { METRICS: '1', HIDDEN_PACKAGES: 'prom-client' }, 'metrics needs the prom-client package: npm install prom-client'],
  ])('stops at start-up naming the package to install: %s', async (_name, env, message) => {
    const failure = await node(['--import', './hide-optional-peers.mjs', 'dist/main.js'], env).then(
      () => undefined,
      (error: { code: number; stderr: string }) => error,
    );
    expect(failure?.code).not.toBe(0);
    expect(failure?.stderr).toContain(message);
  });

  it('keeps TypeORM behind its own entry, which names the missing peer', async () => {
    const failure = await node(['--input-type=module', '-e', "await import('nestjs-idempotency/typeorm')"]).catch((error: { stderr: string }) => error);
    expect((failure as { stderr: string }).stderr).toMatch(/Cannot find package 'typeorm'/);
  });
});
