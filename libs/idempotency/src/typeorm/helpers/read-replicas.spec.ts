// insertOnce and transition on a DataSource with read replicas, outside a transaction. TypeORM
// sends a plain find to a replica, and a replica lags: the row whose unique key refused the
// INSERT was committed on the primary milliseconds ago and may not be there yet, so the duplicate
// was rethrown as an error instead of answered `created: false` (found in session 14); a repeated
// transition was told `not_found` (or a stale state's reason) instead of `already_done`. The
// lagging replica here is a second login whose search path holds an empty copy of the table.
import { afterAll, beforeAll, describe, expect, it } from '@jest/globals';
import { randomUUID } from 'node:crypto';
import { Column, DataSource, Entity, Index, PrimaryGeneratedColumn, Repository, VersionColumn, type FindOneOptions } from 'typeorm';
import { adminQuery } from '../../../../../test/support/test-schema.js';
import { DATABASE_URL } from '../../../../../test/support/services.js';
import { transition } from './conditional-transition.js';
import { insertOnce } from './insert-once.js';

@Entity({ name: 'tickets' })
@Index('uq_tickets_code', ['code'], { unique: true })
class Ticket {
  @PrimaryGeneratedColumn()
  id!: number;

  @Column({ type: 'varchar', length: 64 })
  code!: string;

  @Column({ type: 'varchar', length: 16, default: 'OPEN' })
  status!: string;

  @VersionColumn({ default: 1 })
  version!: number;
}

describe('insertOnce and transition with read replicas (PostgreSQL)', () => {
  const tag = randomUUID().replace(/-/g, '').slice(0, 10);
  const primary = `idem_primary_${tag}`;
  const replica = `idem_replica_${tag}`;
  const urlAs = (role: string) => {
    const url = new URL(DATABASE_URL);
    url.username = role;
    url.password = '';
    return url.toString();
  };
  let dataSource: DataSource;

  beforeAll(async () => {
    for (const role of [primary, replica]) {
      await adminQuery(`CREATE ROLE ${role} LOGIN`);
      await adminQuery(`CREATE SCHEMA ${role} AUTHORIZATION ${role}`);
      await adminQuery(`ALTER ROLE ${role} SET search_path = ${role}`);
    }
    dataSource = new DataSource({
      type: 'postgres',
      entities: [Ticket],
      synchronize: true,
      replication: { master: { url: urlAs(primary) }, slaves: [{ url: urlAs(replica) }] },
    });
    await dataSource.initialize();
    // The replica's copy of the table, empty: it has not caught up.
    await adminQuery(`CREATE TABLE ${replica}.tickets (LIKE ${primary}.tickets INCLUDING ALL); ALTER TABLE ${replica}.tickets OWNER TO ${replica}`);
  });

  afterAll(async () => {
    await dataSource?.destroy();
    for (const role of [primary, replica]) {
      await adminQuery(`DROP SCHEMA IF EXISTS ${role} CASCADE`);
      await adminQuery(`DROP ROLE IF EXISTS ${role}`);
    }
  });

  it('answers a duplicate with the row on the primary, not a lagging replica', async () => {
    const repo = dataSource.getRepository(Ticket);
    const first = await insertOnce(repo, { code: 'T-1' }, () => ({ code: 'T-1' }));
    expect(first).toMatchObject({ created: true, entity: { code: 'T-1' } });
    // The replica lags: a plain find does not see the row.
    expect(await repo.findOne({ where: { code: 'T-1' } })).toBeNull();
    const again = await insertOnce(repo, { code: 'T-1' }, () => ({ code: 'T-1' }));
    expect(again).toEqual({ created: false, entity: { id: first.entity.id, code: 'T-1', status: 'OPEN', version: 1 }, constraint: 'uq_tickets_code' });
  });

  // Rounds 1 and 2 of this session's adversaries: reading through the repository on the primary
  // (`withRepository`, then a view of it) broke custom repositories of several shapes: a
  // constructor taking a DataSource (TypeError), one ignoring its arguments, a `findOne` bound
  // to the instance (both read on the replica again), private members (TypeError).
  it.each([
    ['Repository.extend with its own findOne', (ds: DataSource) => ds.getRepository(Ticket).extend({
      findOne(this: Repository<Ticket>, options: FindOneOptions<Ticket>) {
        return Repository.prototype.findOne.call(this, options) as Promise<Ticket | null>;
      },
    })],
    ['a constructor taking the DataSource', (ds: DataSource) => new (class TicketRepository extends Repository<Ticket> {
      constructor(source: DataSource) {
        super(Ticket, source.createEntityManager());
      }
    })(ds)],
    ['a constructor taking nothing', (ds: DataSource) => new (class TicketRepository extends Repository<Ticket> {
      constructor() {
        super(Ticket, ds.manager);
      }
    })()],
    ['a findOne bound to the instance', (ds: DataSource) => {
      const repo = ds.getRepository(Ticket).extend({});
      repo.findOne = repo.findOne.bind(repo);
      return repo;
    }],
    ['a private member its findOne reads', (ds: DataSource) => new (class TicketRepository extends Repository<Ticket> {
      readonly #tenant = 'all';
      constructor() {
        super(Ticket, ds.manager);
      }
      override findOne(options: FindOneOptions<Ticket>) {
        return this.#tenant === 'all' ? super.findOne(options) : Promise.resolve(null);
      }
    })()],
  ])('reads on the primary with a custom repository: %s', async (_what, make) => {
    const repo = make(dataSource) as Repository<Ticket>;
    const code = `T-${randomUUID().slice(0, 8)}`;
    await insertOnce(repo, { code }, () => ({ code }));
    expect(await insertOnce(repo, { code }, () => ({ code }))).toMatchObject({ created: false, entity: { code } });
    const { entity } = await insertOnce(repo, { code: `${code}-b` }, () => ({ code: `${code}-b` }));
    const close = () => transition(repo, { where: { id: entity.id }, from: ['OPEN'], to: 'CLOSED' });
    await close();
    expect(await close()).toMatchObject({ changed: false, reason: 'already_done' });
  });

  it('tells a repeated transition already_done from the row on the primary', async () => {
    const repo = dataSource.getRepository(Ticket);
    const { entity } = await insertOnce(repo, { code: 'T-3' }, () => ({ code: 'T-3' }));
    const close = () => transition(repo, { where: { id: entity.id }, from: ['OPEN'], to: 'CLOSED' });
    expect(await close()).toMatchObject({ changed: true, entity: { status: 'CLOSED', version: 2 } });
    expect(await close()).toEqual({ changed: false, reason: 'already_done', entity: { ...entity, status: 'CLOSED', version: 2 } });
  });
});
