import type { QueryRunner } from 'typeorm';

/**
 * The quoted table name, in the DataSource's `schema` when it sets one (as TypeORM places the
 * entities and its own `migrations` table there), else unqualified (the search path decides).
 */
export function tableIn(queryRunner: QueryRunner, table: string): string {
  const { schema } = queryRunner.connection.driver;
  const quote = (identifier: string) => `"${identifier.replace(/"/g, '""')}"`;
  return schema ? `${quote(schema)}.${quote(table)}` : quote(table);
}
