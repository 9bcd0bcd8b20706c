import { createRequire } from 'node:module';
import { join } from 'node:path';
import { fileURLToPath } from 'node:url';

// Compiled to dist/bench/src/paths.js: three levels up is the project root.
export const PROJECT_ROOT = fileURLToPath(new URL('../../../', import.meta.url));
/** The bench's own install (legacy-peer-deps): the peer module and the canonicalisers. */
export const PEERS_DIR = join(PROJECT_ROOT, 'bench', 'peers');
export const RESULTS_DIR = join(PROJECT_ROOT, 'bench', 'results');
export const DIST_BENCH = join(PROJECT_ROOT, 'dist', 'bench', 'src');

/**
 * `require` resolving from bench/peers: its node_modules first, then the project's (autocannon
 * is a root devDependency). CommonJS packages only; Nest 12 itself loads through require(esm).
 */
export const requireFromPeers = createRequire(join(PEERS_DIR, 'package.json'));
