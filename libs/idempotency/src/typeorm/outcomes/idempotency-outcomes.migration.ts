import type { MigrationInterface, QueryRunner } from 'typeorm';
import { entityTable, qualifiedTable } from '../postgres/table-name.js';
import { IDEMPOTENCY_OUTCOMES_TABLE } from './outcome-claim.js';

/** Creates `idempotency_outcomes`, the table of `PostgresOutcomeRecorder` (PostgreSQL). */
export class IdempotencyOutcomes1764547200000 implements MigrationInterface {
  readonly name = 'IdempotencyOutcomes1764547200000';

  async up(queryRunner: QueryRunner): Promise<void> {
    const table = qualifiedTable(entityTable(queryRunner.connection.options, IDEMPOTENCY_OUTCOMES_TABLE), queryRunner.connection.driver.schema);
    await queryRunner.query(`CREATE TABLE ${table} (
      "id" BIGSERIAL NOT NULL,
      "scope" character varying(255) NOT NULL,
      "request_id" character varying(255),
      "content_hash" character varying(64) NOT NULL,
      "state" character varying(16) NOT NULL,
      "token" character varying(64) NOT NULL,
      "attempt" integer NOT NULL DEFAULT 1,
      "status_code" integer,
      "body" text,
      "created_at" TIMESTAMP WITH TIME ZONE NOT NULL DEFAULT now(),
      "updated_at" TIMESTAMP WITH TIME ZONE NOT NULL DEFAULT now(),
      "expires_at" TIMESTAMP WITH TIME ZONE NOT NULL,
      CONSTRAINT "pk_idempotency_outcomes" PRIMARY KEY ("id"),
      CONSTRAINT "uq_idempotency_outcomes_request" UNIQUE ("scope", "request_id"),
      CONSTRAINT "uq_idempotency_outcomes_content" UNIQUE ("scope", "content_hash")
    )`);
    // Purging expired records scans by expiry.
    await queryRunner.query(`CREATE INDEX "idx_idempotency_outcomes_expires_at" ON ${table} ("expires_at")`);
  }

  async down(queryRunner: QueryRunner): Promise<void> {
    const table = qualifiedTable(entityTable(queryRunner.connection.options, IDEMPOTENCY_OUTCOMES_TABLE), queryRunner.connection.driver.schema);
    await queryRunner.query(`DROP TABLE ${table}`);
  }
}

/**
 * The outcome recorder's migration, separate from `IDEMPOTENCY_MIGRATIONS` so that apps which do
 * not record outcomes get no table for it: `migrations: [...IDEMPOTENCY_MIGRATIONS,
 * ...IDEMPOTENCY_OUTCOME_MIGRATIONS, ...yours]`.
 */
export const IDEMPOTENCY_OUTCOME_MIGRATIONS = [IdempotencyOutcomes1764547200000];
