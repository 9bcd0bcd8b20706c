import type { MigrationInterface, QueryRunner } from 'typeorm';

/**
 * The `xml_uploads` table: one row per stored XML receipt upload. Its outcome records live in the
 * library's `idempotency_outcomes` (`IDEMPOTENCY_OUTCOME_MIGRATIONS`). "If not exists" so that a
 * database whose migrations table was reset does not fail here.
 */
export class DemoXmlUploads1796083200000 implements MigrationInterface {
  readonly name = 'DemoXmlUploads1796083200000';

  async up(queryRunner: QueryRunner): Promise<void> {
    await queryRunner.query(`
      CREATE TABLE IF NOT EXISTS "xml_uploads" (
        "id" uuid NOT NULL DEFAULT gen_random_uuid(),
        "user_id" varchar(64),
        "request_id" varchar(255),
        "content_hash" varchar(64) NOT NULL,
        "receipt_no" varchar(64) NOT NULL,
        "amount" numeric(12,2) NOT NULL,
        "created_at" timestamptz NOT NULL DEFAULT now(),
        CONSTRAINT "pk_xml_uploads" PRIMARY KEY ("id")
      )`);
  }

  async down(queryRunner: QueryRunner): Promise<void> {
    await queryRunner.query(`DROP TABLE IF EXISTS "xml_uploads"`);
  }
}
