import type { MigrationInterface, QueryRunner } from 'typeorm';
import { IDEMPOTENCY_RECORDS_TABLE } from './idempotency-record.entity.js';
import { entityTable, qualifiedTable } from '../postgres/table-name.js';

/**
 * Adds `body_encoding` and `unreplayable` to `idempotency_records` (`SavedResponse.encoding` and
 * `.unreplayable`). Nullable and without a default, so PostgreSQL adds them without rewriting the
 * table; rows written before read back with neither field set. `IF NOT EXISTS`: a database that
 * ran a pre-release of this migration under another name upgrades cleanly.
 */
export class IdempotencyResponseFlags1795996800002 implements MigrationInterface {
  readonly name = 'IdempotencyResponseFlags1795996800002';

  async up(queryRunner: QueryRunner): Promise<void> {
    const table = qualifiedTable(entityTable(queryRunner.connection.options, IDEMPOTENCY_RECORDS_TABLE), queryRunner.connection.driver.schema);
    await queryRunner.query(`ALTER TABLE ${table}
      ADD COLUMN IF NOT EXISTS "body_encoding" character varying(16),
      ADD COLUMN IF NOT EXISTS "unreplayable" character varying(32)`);
  }

  async down(queryRunner: QueryRunner): Promise<void> {
    const table = qualifiedTable(entityTable(queryRunner.connection.options, IDEMPOTENCY_RECORDS_TABLE), queryRunner.connection.driver.schema);
    await queryRunner.query(`ALTER TABLE ${table}
      DROP COLUMN "unreplayable",
      DROP COLUMN "body_encoding"`);
  }
}
