import type { MigrationInterface, QueryRunner } from 'typeorm';

/** The `payments` table of `POST /payments`. "If not exists", like the demo's other tables. */
export class DemoPayments1796169600000 implements MigrationInterface {
  readonly name = 'DemoPayments1796169600000';

  async up(queryRunner: QueryRunner): Promise<void> {
    await queryRunner.query(`
      CREATE TABLE IF NOT EXISTS "payments" (
        "id" uuid NOT NULL DEFAULT gen_random_uuid(),
        "order_no" varchar(64) NOT NULL,
        "amount" numeric(12,2) NOT NULL,
        "user_id" varchar(64) NOT NULL,
        "created_at" timestamptz NOT NULL DEFAULT now(),
        CONSTRAINT "pk_payments" PRIMARY KEY ("id")
      )`);
    await queryRunner.query(`CREATE INDEX IF NOT EXISTS "idx_payments_order_no" ON "payments" ("order_no")`);
  }

  async down(queryRunner: QueryRunner): Promise<void> {
    await queryRunner.query(`DROP TABLE IF EXISTS "payments"`);
  }
}
