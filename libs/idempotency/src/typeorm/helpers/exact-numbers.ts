import { isUnsafeInteger } from '../../index.js';

/**
 * Whether every number `where` holds (at any depth of its plain objects and arrays) is finite,
 * and an integer only within ±2^53: NaN (`Number(req.params.id)` of a bad id) reached PostgreSQL,
 * which refused it (22P02: a 500, and the caller's transaction aborted); an integer past 2^53, as
 * a JSON parse rounded it, named another row (the payment of order ...037 paid order ...000):
 * adversarial helpers.
 */
export function namesNumbers(where: unknown, depth = 0): boolean {
  if (typeof where === 'number') return Number.isFinite(where) && !isUnsafeInteger(where);
  if (depth > 8 || typeof where !== 'object' || where === null) return true;
  if (!Array.isArray(where) && Object.getPrototypeOf(where) !== Object.prototype) return true;
  return Object.values(where).every((value) => namesNumbers(value, depth + 1));
}
