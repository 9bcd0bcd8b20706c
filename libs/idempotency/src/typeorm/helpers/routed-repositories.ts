import { Repository, type DataSource, type EntityManager } from 'typeorm';
import { IdempotencyConfigError } from '../../index.js';

/** A target no repository is used for: only the probe's `manager` is read. */
class RoutingProbe {}

/** Per DataSource, a manager of its own and a repository made on it. */
const probes = new WeakMap<DataSource, { manager: EntityManager; repository: Repository<RoutingProbe> }>();

/**
 * Refuses a call that opens its own transaction for `work` while the DataSource's repositories
 * answer another one: typeorm-transactional (`@Transactional()`, `runInTransaction`) patches
 * `Repository.prototype.manager` to give the transaction of the call's context. There, `work`'s
 * `manager.getRepository(X)` wrote in that outer transaction, not in the call's: the call's own
 * row (the consume log's, the record's, the outcome's) committed, and the effect rolled back with
 * the outer transaction (an adversarial helper: 50 of 50 effects lost, their redeliveries answered
 * duplicate). Checked before any statement (no connection taken: inside `@Transactional()` the
 * call's own connection also waited on a pool the outer transactions held). One getter per call.
 */
export function refuseRoutedRepositories(dataSource: DataSource, caller: string, what: string): void {
  let probe = probes.get(dataSource);
  if (!probe) {
    const manager = dataSource.createEntityManager();
    probes.set(dataSource, (probe = { manager, repository: new Repository(RoutingProbe, manager) }));
  }
  if (probe.repository.manager === probe.manager) return;
  throw new IdempotencyConfigError(
    `${caller} was called inside a transaction that routes repositories to itself (typeorm-transactional's @Transactional() or ` +
      `runInTransaction): a repository from manager.getRepository() in its work would write in that transaction, not in ${caller}'s ` +
      `own, and its effect could roll back while ${what} commits. Call ${caller} outside it, or from a method with ` +
      '@Transactional({ propagation: Propagation.NOT_SUPPORTED }).',
  );
}
