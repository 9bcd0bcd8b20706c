import type { FindOptionsWhere, ObjectLiteral, Repository } from 'typeorm';

/**
 * The row `where` names, read where the caller's statement ran: on the repository's own
 * connection when it has one (a transaction's, a QueryRunner's); else on the primary. A plain
 * find goes to a replica when the DataSource has some, and a replica may not have a row the
 * primary committed just now, nor its latest state. Through the repository itself, so that a
 * custom repository's own `findOne` runs: a view of it whose `manager` and `queryRunner` are the
 * primary's runner's (not `withRepository`, which calls the repository's constructor with
 * arguments a subclass's own constructor may not take, or ignore).
 */
export async function findOnPrimary<T extends ObjectLiteral>(
  repo: Repository<T>,
  where: FindOptionsWhere<T> | FindOptionsWhere<T>[],
): Promise<T | null> {
  const { connection } = repo.manager;
  if (repo.manager.queryRunner || !connection.driver.isReplicated) return repo.findOne({ where });
  const runner = connection.createQueryRunner('master');
  try {
    const onPrimary = Object.create(repo, {
      manager: { value: runner.manager },
      queryRunner: { value: runner },
    }) as Repository<T>;
    return await onPrimary.findOne({ where });
  } finally {
    await runner.release();
  }
}
