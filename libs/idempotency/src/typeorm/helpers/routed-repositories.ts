import type { DataSource, EntityManager, ObjectLiteral, Repository } from 'typeorm';
import { IdempotencyConfigError } from '../../index.js';

/** A target no repository is used for: only the probe's `manager` is read. */
class RoutingProbe {}

/** Per DataSource, a manager of its own. */
const probeManagers = new WeakMap<DataSource, EntityManager>();

/**
 * Refuses a call that opens its own transaction for `work` while the DataSource's repositories
 * answer another one: typeorm-transactional (`@Transactional()`, `runInTransaction`) patches
 * `Repository.prototype.manager` to give the transaction of the call's context. There, `work`'s
 * `manager.getRepository(X)` wrote in that outer transaction, not in the call's: the call's own
 * row (the consume log's, the record's, the outcome's) committed, and the effect rolled back with
 * the outer transaction (an adversarial helper: 50 of 50 effects lost, their redeliveries answered
 * duplicate). Checked before any statement (no connection taken: inside `@Transactional()` the
 * call's own connection also waited on a pool the outer transactions held). The probe is made by
 * the DataSource's own manager, so by the app's TypeORM (a second copy of TypeORM under this
 * package's folder was never patched, and its probe saw nothing).
 */
export function refuseRoutedRepositories(dataSource: DataSource, caller: string, what: string): void {
  let manager = probeManagers.get(dataSource);
  if (!manager) probeManagers.set(dataSource, (manager = dataSource.createEntityManager()));
  if (manager.getRepository(RoutingProbe).manager === manager) return;
  throw new IdempotencyConfigError(
    `${caller} was called inside a transaction that routes repositories to itself (typeorm-transactional's @Transactional() or ` +
      `runInTransaction): a repository from manager.getRepository() in its work would write in that transaction, not in ${caller}'s ` +
      `own, and its effect could roll back while ${what} commits. Call ${caller} from code outside any transaction.`,
  );
}

/**
 * Pins the repositories `work` gets from its transaction's `manager` (`getRepository`,
 * `getTreeRepository`, `withRepository`, and their `extend`) to that manager, whatever routes
 * repositories meanwhile. typeorm-transactional decides at each call which transaction a
 * repository writes in: with its AsyncLocalStorage driver, a sibling `@Transactional()` that ran
 * beside `work` (a `Promise.all` in one handler) routed `work`'s writes into itself, after the
 * call-time check had passed, and its rollback lost them (an adversarial helper: 0 of 10 effects,
 * every redelivery answered duplicate); `withRepository` copied the routing of the repository it
 * was given. A repository made outside `work` (injected, `dataSource.getRepository`) is not pinned.
 */
export function pinRepositories(manager: EntityManager): EntityManager {
  if (pinned.has(manager)) return manager;
  pinned.add(manager);
  const { getRepository, getTreeRepository, withRepository } = manager;
  Object.assign(manager, {
    getRepository: (target: never) => pin(getRepository.call(manager, target), manager),
    getTreeRepository: (target: never) => pin(getTreeRepository.call(manager, target), manager),
    withRepository: (repository: Repository<ObjectLiteral>) => pin(withRepository.call(manager, repository), manager),
  });
  return manager;
}

/**
 * Managers and repositories pinned already. The manager caches its repositories, and TypeORM asks
 * it for one at every `save` of an entity with an id: pinned again each time, a repository's
 * `extend` was wrapped once more per call (a batch `work` ran out of stack).
 */
const pinned = new WeakSet<object>();

function pin<R extends Repository<ObjectLiteral>>(repository: R, manager: EntityManager): R {
  if (pinned.has(repository)) return repository;
  pinned.add(repository);
  Object.defineProperty(repository, 'manager', { value: manager, writable: true, enumerable: true, configurable: true });
  const extend = (Object.getPrototypeOf(repository) as R).extend;
  Object.defineProperty(repository, 'extend', {
    value: (custom: never) => pin(extend.call(repository, custom), manager),
    writable: true,
    configurable: true,
  });
  return repository;
}

/**
 * `repo` with the manager it answers now, for a whole call of `insertOnce` or `transition`:
 * typeorm-transactional decides at each read of `repository.manager` which transaction it writes
 * in, and with its AsyncLocalStorage driver a sibling `@Transactional()` beside the call changes
 * that mid-call. `insertOnce`'s savepoint went to the caller's transaction and its INSERT to the
 * sibling's, which rolled it back: `created: true` and no row (an adversarial helper: up to 9 of
 * 9 orders lost); `transition`'s read after its UPDATE would see another transaction. The
 * caller's repository itself is left as it is (its custom methods and properties come through).
 */
export function inCallersTransaction<T extends ObjectLiteral>(repo: Repository<T>): Repository<T> {
  return Object.create(repo, { manager: { value: repo.manager, enumerable: true } }) as Repository<T>;
}
