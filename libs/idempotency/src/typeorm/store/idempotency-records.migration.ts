import type { MigrationInterface, QueryRunner } from 'typeorm';
import { IDEMPOTENCY_RECORDS_TABLE } from './idempotency-record.entity.js';
import { entityTable, qualifiedTable } from '../postgres/table-name.js';

/** Creates `idempotency_records`, the table of `PostgresIdempotencyStore` (PostgreSQL). */
export class IdempotencyRecords1764460800000 implements MigrationInterface {
  readonly name = 'IdempotencyRecords1764460800000';

  async up(queryRunner: QueryRunner): Promise<void> {
    const table = qualifiedTable(entityTable(queryRunner.connection.options, IDEMPOTENCY_RECORDS_TABLE), queryRunner.connection.driver.schema);
    await queryRunner.query(`CREATE TABLE ${table} (
      "key" character varying(1024) NOT NULL,
      "state" character varying(16) NOT NULL,
      "token" character varying(64) NOT NULL,
      "fingerprint" character varying(128) NOT NULL,
      "status_code" integer,
      "headers" jsonb,
      "body" text,
      "has_body" boolean NOT NULL DEFAULT false,
      "expires_at" TIMESTAMP WITH TIME ZONE NOT NULL,
      CONSTRAINT "pk_idempotency_records" PRIMARY KEY ("key")
    )`);
    // Purging expired records scans by expiry.
    await queryRunner.query(`CREATE INDEX "idx_idempotency_records_expires_at" ON ${table} ("expires_at")`);
  }

  async down(queryRunner: QueryRunner): Promise<void> {
    const table = qualifiedTable(entityTable(queryRunner.connection.options, IDEMPOTENCY_RECORDS_TABLE), queryRunner.connection.driver.schema);
    await queryRunner.query(`DROP TABLE ${table}`);
  }
}
