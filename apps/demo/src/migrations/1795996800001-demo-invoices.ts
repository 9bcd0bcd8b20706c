import type { MigrationInterface, QueryRunner } from 'typeorm';

/**
 * The `invoices` table: one row per idempotency token, and one per (terminal, number).
 * "If not exists" so that a database whose migrations table was reset does not fail here.
 */
export class DemoInvoices1795996800001 implements MigrationInterface {
  readonly name = 'DemoInvoices1795996800001';

  async up(queryRunner: QueryRunner): Promise<void> {
    await queryRunner.query(`
      CREATE TABLE IF NOT EXISTS "invoices" (
        "id" uuid NOT NULL DEFAULT gen_random_uuid(),
        "idempotency_token" uuid NOT NULL,
        "terminal_id" varchar(64) NOT NULL,
        "number" varchar(64) NOT NULL,
        "amount" numeric(12,2) NOT NULL,
        "created_at" timestamptz NOT NULL DEFAULT now(),
        CONSTRAINT "pk_invoices" PRIMARY KEY ("id")
      )`);
    await queryRunner.query(
      `CREATE UNIQUE INDEX IF NOT EXISTS "uq_invoices_token" ON "invoices" ("idempotency_token")`,
    );
    await queryRunner.query(
      `CREATE UNIQUE INDEX IF NOT EXISTS "uq_invoices_terminal_number" ON "invoices" ("terminal_id", "number")`,
    );
  }

  async down(queryRunner: QueryRunner): Promise<void> {
    await queryRunner.query(`DROP TABLE IF EXISTS "invoices"`);
  }
}
