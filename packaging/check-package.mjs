// Checks a built package directory before it is packed:
// - every target of "exports", "types" and "main" exists, and each subpath of "exports" has its
//   declarations in "typesVersions" (for TypeScript's `moduleResolution: node`);
// - following the static imports of the emitted JavaScript from each entry point, every package
//   imported is a Node built-in, a dependency or a peer dependency, and the main entry (".")
//   imports no *optional* peer at load time: a user who installs only what their store needs
//   must be able to import it. (Subpath entries such as "./typeorm" may import their own peer.)
// Returns the problems found, each naming the import chain and the line.
import { existsSync, readFileSync } from 'node:fs';
import { builtinModules } from 'node:module';
import { dirname, join, relative, resolve } from 'node:path';

const STATIC_FROM = /^[ \t]*(?:import|export)\b[^'"`;]*?\bfrom\s*(['"])([^'"]+)\1/gm;
const SIDE_EFFECT = /^[ \t]*import\s*(['"])([^'"]+)\1/gm;

/** Every string target of an "exports" value, with the subpath it belongs to. */
function targetsOf(exportsField) {
  const out = [];
  const walk = (value, subpath, condition) => {
    if (typeof value === 'string') out.push({ subpath, condition, target: value });
    else if (value && typeof value === 'object') for (const [k, v] of Object.entries(value)) walk(v, subpath, k);
  };
  if (typeof exportsField === 'string') walk(exportsField, '.', 'default');
  else for (const [subpath, value] of Object.entries(exportsField ?? {})) walk(value, subpath, 'default');
  return out;
}

const packageOf = (specifier) => specifier.split('/').slice(0, specifier.startsWith('@') ? 2 : 1).join('/');
const isBuiltin = (specifier) => specifier.startsWith('node:') || builtinModules.includes(specifier.split('/')[0]);

/** The static imports of one emitted file: [{ specifier, line, text }]. */
function importsOf(file) {
  const source = readFileSync(file, 'utf8');
  const found = [];
  for (const pattern of [STATIC_FROM, SIDE_EFFECT]) {
    for (const match of source.matchAll(pattern)) {
      const line = source.slice(0, match.index).split('\n').length;
      found.push({ specifier: match[2], line, text: match[0].trim().replace(/\s+/g, ' ') });
    }
  }
  return found;
}

export function checkPackage(stage) {
  const manifest = JSON.parse(readFileSync(join(stage, 'package.json'), 'utf8'));
  const problems = [];
  const peers = manifest.peerDependencies ?? {};
  const optional = new Set(Object.entries(manifest.peerDependenciesMeta ?? {}).filter(([, m]) => m.optional).map(([n]) => n));
  const allowed = new Set([...Object.keys(manifest.dependencies ?? {}), ...Object.keys(peers)]);

  const targets = targetsOf(manifest.exports);
  if (manifest.types) targets.push({ subpath: '.', condition: 'types', target: manifest.types });
  if (manifest.main) targets.push({ subpath: '.', condition: 'main', target: manifest.main });
  for (const { subpath, target } of targets) {
    if (!existsSync(join(stage, target))) problems.push(`exports "${subpath}" → ${target} does not exist`);
  }
  // TypeScript's `moduleResolution: node` (node10) ignores "exports": each subpath entry needs its
  // declarations in "typesVersions" too.
  const typesVersions = manifest.typesVersions?.['*'] ?? {};
  for (const subpath of Object.keys(manifest.exports ?? {}).filter((s) => s !== '.' && s !== './package.json')) {
    const [target] = typesVersions[subpath.slice(2)] ?? [];
    if (!target) problems.push(`exports "${subpath}" has no "typesVersions" entry (TypeScript's moduleResolution node cannot find its types)`);
    else if (!existsSync(join(stage, target))) problems.push(`typesVersions "${subpath.slice(2)}" → ${target} does not exist`);
  }

  for (const { subpath, condition, target } of targets) {
    if (condition === 'types' || condition === 'main' || !target.endsWith('.js') || !existsSync(join(stage, target))) continue;
    const entry = resolve(stage, target);
    const parent = new Map([[entry, undefined]]);
    const queue = [entry];
    const chain = (file) => {
      const files = [];
      for (let at = file; at; at = parent.get(at)?.from) files.unshift(relative(stage, at));
      return files.join(' → ');
    };
    while (queue.length > 0) {
      const file = queue.shift();
      for (const imported of importsOf(file)) {
        const { specifier } = imported;
        if (specifier.startsWith('.')) {
          const next = resolve(dirname(file), specifier);
          if (!existsSync(next)) problems.push(`${chain(file)}:${imported.line} imports ${specifier}, which was not emitted`);
          else if (!parent.has(next)) {
            parent.set(next, { from: file });
            queue.push(next);
          }
          continue;
        }
        if (isBuiltin(specifier)) continue;
        const name = packageOf(specifier);
        const where = `${chain(file)}:${imported.line} \`${imported.text}\``;
        if (!allowed.has(name)) problems.push(`"${subpath}" imports ${name}, which is neither a dependency nor a peer: ${where}`);
        else if (subpath === '.' && optional.has(name)) {
          problems.push(`the main entry needs the optional peer ${name} at import time: ${where}`);
        }
      }
    }
  }
  return problems;
}
