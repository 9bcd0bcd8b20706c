import type { FindOptionsWhere, ObjectLiteral, QueryDeepPartialEntity, Repository } from 'typeorm';
import type { ColumnMetadata } from 'typeorm/metadata/ColumnMetadata.js';
import { coverNewConnections } from '../postgres/new-connections.js';
import { namesNumbers } from './exact-numbers.js';
import { findOnPrimary } from './find-on-primary.js';
import { inItsTurn } from './insert-once.js';
import { inCallersTransaction } from './routed-repositories.js';

/** A property of `T`, or a path into one of its embedded column groups (`'lifecycle.status'`). */
export type PropertyPath<T> = (keyof T & string) | `${keyof T & string}.${string}`;

/** A state change `transition` applies only from the states it names. */
export interface TransitionSpec<T> {
  /** Identifies the row (entity columns only, no relations), e.g. `{ id }`; one that names none is refused. */
  where: FindOptionsWhere<T>;
  /** States the change may start from. Must not include `to` (a repeat would apply again). */
  from: readonly string[];
  /** The new state. */
  to: string;
  /** Other fields the change sets, e.g. `{ paidAt: () => 'now()', transactionId }`. */
  set?: QueryDeepPartialEntity<T>;
  /** The state property, or a path into an embedded column group (`'lifecycle.status'`). Default `'status'`. */
  statusProperty?: PropertyPath<T>;
  /** The counter bumped by every change (a property or a path, as `statusProperty`), or `false` for none. Default `'version'`. */
  versionProperty?: PropertyPath<T> | false;
  /** Change only if the row still has this version (optimistic locking). */
  expectedVersion?: number;
}

/** Why a transition changed nothing. */
export type TransitionRefusal = 'not_found' | 'already_done' | 'not_allowed' | 'version_conflict';

/** What `transition` did; `entity` is the row as the change left it, or as it was found. */
export type TransitionResult<T> =
  | { changed: true; entity: T }
  | { changed: false; reason: TransitionRefusal; entity?: T };

/**
 * Moves a row from one of `from` to `to` with ONE conditional statement:
 * `UPDATE ... SET status = :to, <set>, version = version + 1 WHERE <where> AND status IN (:from)
 * [AND version = :expectedVersion]`. The database decides between concurrent callers: exactly
 * one changes the row, and fields the winner set (a payment id, a timestamp) are never
 * overwritten by a repeat, because the row no longer matches `status IN (:from)`.
 *
 * A soft-deleted row (an entity with a `@DeleteDateColumn`) is absent, as TypeORM's finds take it.
 *
 * When nothing changed, reads the row once to say why (on the primary, with read replicas):
 * absent → `not_found`; already in `to` → `already_done`; in a state outside `from` →
 * `not_allowed`; another version than `expectedVersion` → `version_conflict`. A row that a
 * concurrent change moved into a `from` state after the UPDATE looked is tried again (at most 3
 * times in all, then `version_conflict`).
 * On drivers with `UPDATE ... RETURNING` (PostgreSQL, SQLite, MariaDB) the changed row comes
 * back with the statement; elsewhere it is read after it.
 *
 * Runs at the caller's isolation level; under REPEATABLE READ or SERIALIZABLE a concurrent
 * transition committed after the transaction's snapshot makes the UPDATE fail with a
 * serialization error (PostgreSQL 40001) instead of `already_done` (retry the transaction: the
 * retry sees the row and answers `already_done`). The transaction is aborted by then, and its
 * snapshot cannot see the winner's row, so the error is not mapped.
 */
export async function transition<T extends ObjectLiteral>(
  given: Repository<T>,
  spec: TransitionSpec<T>,
): Promise<TransitionResult<T>> {
  const repo = inCallersTransaction(given);
  const statusProperty = spec.statusProperty ?? 'status';
  const versionProperty = spec.versionProperty ?? 'version';
  if (spec.from.length === 0) throw new RangeError('transition: `from` names no state');
  if (spec.from.some((state) => state === null || state === undefined)) {
    throw new RangeError('transition: `from` holds null, which no row is IN; give the state a value (a NOT NULL column with a default)');
  }
  if (!namesRow(repo, spec.where)) {
    throw new RangeError(`transition: \`where\` names no row (${shown(spec.where)}); it would change every row in a \`from\` state`);
  }
  if (spec.from.includes(spec.to)) {
    throw new RangeError(`transition: \`from\` includes \`to\` (${spec.to}); a repeat would apply again`);
  }
  // null as no version (`ifMatch ?? null` from JavaScript), as undefined.
  const expectedVersion = spec.expectedVersion ?? undefined;
  if (!namesNumbers(spec.where)) {
    throw new RangeError(
      `transition: \`where\` holds a number that names no one row (NaN, an infinity or an integer past 2^53, which a JSON parse rounds: ${shown(spec.where)}); send such ids as strings`,
    );
  }
  if (expectedVersion !== undefined && versionProperty === false) {
    throw new RangeError('transition: `expectedVersion` needs a `versionProperty`');
  }
  if (expectedVersion !== undefined && !Number.isSafeInteger(expectedVersion)) {
    // The database refused it (22P02, a 500 and an aborted transaction): NaN from a parsed If-Match.
    throw new RangeError(`transition: \`expectedVersion\` must be an integer (got ${shown(expectedVersion)})`);
  }
  coverNewConnections(repo.manager.connection);
  const statusColumn = columnOf(repo, statusProperty);
  const driver = repo.manager.connection.driver;
  // The states as the column stores them: `to` goes through its transformer in the SET, and so
  // must `from` in the WHERE (given as they were, IN ('PENDING') never matched a stored 'pending':
  // an adversarial helper, 30 of 30 calls answered version_conflict and the row never moved).
  const stored = (state: string): unknown => driver.preparePersistentValue(state, statusColumn);
  knowsStates(repo, statusColumn, [...spec.from, spec.to], stored);
  const versionColumn = versionProperty === false ? undefined : columnOf(repo, versionProperty);
  const quoted = (column: ColumnMetadata) => driver.escape(column.databaseName);

  // By property path, nested: a state or version in an embedded column group ('lifecycle.status')
  // set as a property of that name was written NULL, and answered changed (an adversarial helper).
  const patch: Record<string, unknown> = { ...spec.set };
  setPath(patch, statusColumn.propertyPath, spec.to);
  if (versionColumn) setPath(patch, versionColumn.propertyPath, () => `${quoted(versionColumn)} + 1`);
  const update = repo
    .createQueryBuilder()
    .update()
    .set(patch as QueryDeepPartialEntity<T>)
    .where(spec.where)
    .andWhere(`${quoted(statusColumn)} IN (:...transitionFrom)`, { transitionFrom: spec.from.map(stored) });
  // A soft-deleted row is absent, as TypeORM's finds (and the read below) take it: its UPDATE adds no such condition.
  const deleteDateColumn = repo.metadata.deleteDateColumn;
  if (deleteDateColumn) update.andWhere(`${quoted(deleteDateColumn)} IS NULL`);
  if (versionColumn && expectedVersion !== undefined) {
    update.andWhere(`${quoted(versionColumn)} = :transitionVersion`, { transitionVersion: expectedVersion });
  }
  const returning = driver.isReturningSqlSupported('update');
  if (returning) update.returning('*');
  // A fixed-width column reads back padded ('CLOSED    '), which PostgreSQL compares unpadded.
  const fixedWidth = FIXED_WIDTH.has(String(statusColumn.type));
  const state = (value: unknown) => (fixedWidth && typeof value === 'string' ? value.trimEnd() : value);

  // In its turn among insertOnce calls beside it on the same transaction (see inItsTurn).
  return inItsTurn(repo, async (): Promise<TransitionResult<T>> => {
    for (let attempt = 1; ; attempt++) {
      const result = await update.execute();
      if ((result.affected ?? 0) > 0) {
        const rows = result.raw as ObjectLiteral[];
        const entity = returning && rows[0] ? hydrate(repo, rows[0]) : await findOnPrimary(repo, spec.where);
        // Only a delete between the UPDATE and the read (no RETURNING) leaves nothing to show.
        if (entity) return { changed: true, entity };
      }
      const current = await findOnPrimary(repo, spec.where);
      if (!current) return { changed: false, reason: 'not_found' };
      const status = state(statusColumn.getEntityValue(current));
      if (status === state(spec.to)) return { changed: false, reason: 'already_done', entity: current };
      if (!spec.from.some((from) => state(from) === status)) return { changed: false, reason: 'not_allowed', entity: current };
      // The state allows the change now: the version differed, or a concurrent change moved the
      // row into a `from` state after the UPDATE looked (PENDING when it ran, PAID when read). That
      // one is tried again: answered `version_conflict` though no version was given, a caller
      // took a change that would go through for a conflict (an adversarial helper: 6 of 50).
      const versionDiffers =
        versionColumn !== undefined && expectedVersion !== undefined && Number(versionColumn.getEntityValue(current)) !== expectedVersion;
      if (versionDiffers || attempt >= MAX_ATTEMPTS) return { changed: false, reason: 'version_conflict', entity: current };
    }
  });
}

/** How many times a transition's UPDATE runs when the row moved into a `from` state meanwhile. */
const MAX_ATTEMPTS = 3;

/** Column types whose values are padded to their width. */
const FIXED_WIDTH = new Set(['char', 'character', 'nchar', 'national char']);

/**
 * Whether `where` names a row. TypeORM takes `{}`, `[]` and objects naming no column (an
 * embedded column group's or a relation's `{}`, a Date given for one) for none, while a value
 * object under a transformer or a jsonb `{}` are conditions: so TypeORM is asked, by the SELECT
 * it builds for `where` (no round trip), against the one it builds for `{}` (its own conditions:
 * a soft-delete column, an inheritance discriminator). Each element of an array must name a row
 * (`[{}, { id }]` is `1=1 OR ...`), and an element whose values are all `undefined` names none
 * (TypeORM's `invalidWhereValuesBehavior: 'ignore'` makes `= NULL` of them). Its own refusals
 * (an `undefined` value, by default) are thrown as they are.
 */
function namesRow<T extends ObjectLiteral>(repo: Repository<T>, where: FindOptionsWhere<T> | FindOptionsWhere<T>[]): boolean {
  const elements: unknown[] = Array.isArray(where) ? where : [where];
  if (elements.length === 0) return false;
  const probe = (condition: unknown) =>
    repo
      .createQueryBuilder('transition_probe')
      .select('1')
      .where(condition as FindOptionsWhere<T>)
      .getQuery();
  const none = probe({});
  return elements.every(
    (element) =>
      typeof element === 'object' && element !== null && Object.values(element).some((value) => value !== undefined) && probe(element) !== none,
  );
}

/** A `where` as the error shows it (JSON, or its text where JSON cannot hold it: a BigInt, a cycle). */
function shown(where: unknown): string {
  try {
    return JSON.stringify(where) ?? String(where);
  } catch {
    return String(where);
  }
}

/**
 * Sets `value` at a property path of `patch` (`lifecycle.status`: `patch.lifecycle.status`),
 * copying the plain objects on the way, so that the caller's `set` is never changed.
 */
function setPath(patch: Record<string, unknown>, path: string, value: unknown): void {
  const names = path.split('.');
  let target = patch;
  for (const name of names.slice(0, -1)) {
    const inner = target[name];
    const copy: Record<string, unknown> = typeof inner === 'object' && inner !== null && !Array.isArray(inner) ? { ...inner } : {};
    target[name] = copy;
    target = copy;
  }
  target[names[names.length - 1]!] = value;
}

function columnOf<T extends ObjectLiteral>(repo: Repository<T>, property: string): ColumnMetadata {
  const column = repo.metadata.findColumnWithPropertyPath(property);
  if (!column) throw new RangeError(`transition: ${repo.metadata.name} has no column "${property}"`);
  return column;
}

/**
 * Refuses a state an enum column does not know, as transition's own error: PostgreSQL's
 * `invalid input value for enum` (22P02) named neither the entity nor the states it takes.
 */
function knowsStates<T extends ObjectLiteral>(
  repo: Repository<T>,
  column: ColumnMetadata,
  states: readonly string[],
  stored: (state: string) => unknown,
): void {
  if (!column.enum) return;
  const known = column.enum.map(String);
  const unknown = states.find((state) => !known.includes(String(stored(state))));
  if (unknown === undefined) return;
  throw new RangeError(
    `transition: ${repo.metadata.name}.${column.propertyPath} has no state ${JSON.stringify(unknown)} (its states: ${known.join(', ')})`,
  );
}

/** Turns a RETURNING row into an entity the way TypeORM hydrates query results. */
function hydrate<T extends ObjectLiteral>(repo: Repository<T>, row: ObjectLiteral): T {
  const entity = repo.metadata.create(repo.manager.queryRunner, { fromDeserializer: true }) as T;
  const driver = repo.manager.connection.driver;
  for (const column of repo.metadata.columns) {
    // Columns a find leaves out (`select: false`, e.g. secrets) stay out here too.
    if (column.isVirtual || !column.isSelect || !(column.databaseName in row)) continue;
    column.setEntityValue(entity, driver.prepareHydratedValue(row[column.databaseName], column));
  }
  return entity;
}
