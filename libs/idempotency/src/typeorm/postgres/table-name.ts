/**
 * A table name quoted for SQL. `name` is `table` or `schema.table`; a bare name goes into
 * `schema` when one is given (the DataSource's, where TypeORM places the entities and its own
 * `migrations` table), else stays unqualified (the search path decides).
 */
export function qualifiedTable(name: string, schema: string | undefined): string {
  const dot = name.indexOf('.');
  const [owner, table] = dot > 0 ? [name.slice(0, dot), name.slice(dot + 1)] : [schema, name];
  return owner ? `${quoteIdent(owner)}.${quoteIdent(table)}` : quoteIdent(table);
}

function quoteIdent(identifier: string): string {
  return `"${identifier.replace(/"/g, '""')}"`;
}

/**
 * The name TypeORM gives the table of an entity named `name` on a DataSource with these options:
 * `name` under its `entityPrefix`. The migrations and the default tables use it, so that they
 * name the tables the entities do (`synchronize`, `consumeOnce`).
 */
export function entityTable(options: { entityPrefix?: string }, name: string): string {
  return (options.entityPrefix ?? '') + name;
}
