import type {
  DeepPartial,
  FindOptionsWhere,
  ObjectLiteral,
  QueryDeepPartialEntity,
  QueryRunner,
  Repository,
} from 'typeorm';
import { uniqueViolationOf, type UniqueViolation } from './unique-violation.js';

/** What `insertOnce` did: inserted the row, or found the one a unique constraint protects. */
export type InsertOnceResult<T> =
  | { created: true; entity: T }
  | { created: false; entity: T; constraint?: string };

/**
 * Inserts `values` with one plain INSERT and lets the database's unique constraints decide between
 * concurrent callers (never find-then-insert, which lets two callers both pass the find). When a
 * unique constraint refuses the row, loads the row it protects with `findExisting(violation)`
 * and returns it with `created: false`.
 *
 * Inside a transaction (the repository of a transactional `EntityManager`), the INSERT runs under
 * a savepoint, so a refused row does not abort the transaction on PostgreSQL: the transaction
 * carries on and may commit its other work.
 *
 * Rethrows the original error when it is not a unique violation, and when no row matches
 * `findExisting` after one (the other row was deleted meanwhile, or, under REPEATABLE READ or
 * SERIALIZABLE, it was committed after this transaction's snapshot and is invisible to it).
 *
 * @param findExisting where to find the existing row, e.g. `(v) => ({ orderNo })`; the violation
 *   says which constraint refused the row, for tables with more than one unique key.
 */
export async function insertOnce<T extends ObjectLiteral>(
  repo: Repository<T>,
  values: DeepPartial<T>,
  findExisting: (violation: UniqueViolation) => FindOptionsWhere<T> | FindOptionsWhere<T>[],
): Promise<InsertOnceResult<T>> {
  const entity = repo.create(values);
  const queryRunner = repo.manager.queryRunner;
  const inTransaction = queryRunner?.isTransactionActive === true;
  try {
    const insert = () => repo.insert(entity as QueryDeepPartialEntity<T>);
    const result = inTransaction ? await underSavepoint(queryRunner!, insert) : await insert();
    // Database defaults (generated id, created_at, version) come back through RETURNING.
    const generated = result.generatedMaps[0];
    if (generated) repo.merge(entity, generated as DeepPartial<T>);
    return { created: true, entity };
  } catch (error) {
    const violation = uniqueViolationOf(error);
    if (!violation) throw error;
    const existing = await repo.findOne({ where: findExisting(violation) });
    if (!existing) throw error;
    return { created: false, entity: existing, constraint: violation.constraint };
  }
}

/**
 * Runs `work` under a savepoint of the active transaction. TypeORM turns a nested
 * start/commit/rollback into SAVEPOINT / RELEASE SAVEPOINT / ROLLBACK TO SAVEPOINT on every
 * driver, and keeps its own transaction depth right, which hand-written SAVEPOINTs would not.
 */
async function underSavepoint<R>(queryRunner: QueryRunner, work: () => Promise<R>): Promise<R> {
  await queryRunner.startTransaction();
  try {
    const result = await work();
    await queryRunner.commitTransaction();
    return result;
  } catch (error) {
    await queryRunner.rollbackTransaction();
    throw error;
  }
}
