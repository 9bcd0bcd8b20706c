import type { FindOptionsWhere, ObjectLiteral, Repository } from 'typeorm';

/**
 * The row `where` names, read where the caller's statement ran: on the repository's own
 * connection when it has one (a transaction's, a QueryRunner's), else through the repository as
 * it is, when the DataSource has no replicas. With replicas a plain find goes to a replica, and a
 * replica may not have a row the primary committed just now, nor its latest state: the row is
 * read by the entity manager of a runner on the primary. Not through the repository there: a view
 * of it bound to that runner breaks private members (`#field`) and misses a `findOne` bound to the
 * instance, and `withRepository` calls its constructor with arguments a subclass may not take.
 */
export async function findOnPrimary<T extends ObjectLiteral>(repo: Repository<T>, where: FindOptionsWhere<T> | FindOptionsWhere<T>[]): Promise<T | null>;
/** The rows `where` names, at most `take` of them, read as above. */
export async function findOnPrimary<T extends ObjectLiteral>(repo: Repository<T>, where: FindOptionsWhere<T> | FindOptionsWhere<T>[], take: number): Promise<T[]>;
export async function findOnPrimary<T extends ObjectLiteral>(
  repo: Repository<T>,
  where: FindOptionsWhere<T> | FindOptionsWhere<T>[],
  take?: number,
): Promise<T | null | T[]> {
  const { connection } = repo.manager;
  if (repo.manager.queryRunner || !connection.driver.isReplicated) return take === undefined ? repo.findOne({ where }) : repo.find({ where, take });
  const runner = connection.createQueryRunner('master');
  try {
    const { target } = repo.metadata;
    return await (take === undefined ? runner.manager.findOne<T>(target, { where }) : runner.manager.find<T>(target, { where, take }));
  } finally {
    await runner.release();
  }
}
