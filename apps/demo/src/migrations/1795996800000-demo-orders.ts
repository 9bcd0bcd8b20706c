import type { MigrationInterface, QueryRunner } from 'typeorm';

/**
 * The `orders` table. Written to also adopt an `orders` table that TypeORM's `synchronize`
 * created before the demo had migrations (in a developer's `.data/pg` or the shared test
 * database): every step is "if not exists", and the one column whose type changed is altered.
 */
export class DemoOrders1795996800000 implements MigrationInterface {
  readonly name = 'DemoOrders1795996800000';

  async up(queryRunner: QueryRunner): Promise<void> {
    await queryRunner.query(`
      CREATE TABLE IF NOT EXISTS "orders" (
        "id" uuid NOT NULL DEFAULT gen_random_uuid(),
        "order_no" varchar(64) NOT NULL,
        "user_id" varchar(64) NOT NULL,
        "amount" numeric(12,2) NOT NULL,
        "status" varchar(16) NOT NULL DEFAULT 'PENDING',
        "created_at" timestamptz NOT NULL DEFAULT now(),
        "transaction_id" varchar(128),
        "paid_at" timestamptz,
        "version" integer NOT NULL DEFAULT 1,
        CONSTRAINT "pk_orders" PRIMARY KEY ("id")
      )`);
    // A table made by an older synchronize may lack the payment columns, or have a shorter
    // transaction_id (varchar(64)); widening a varchar does not rewrite the table.
    await queryRunner.query(`
      ALTER TABLE "orders"
        ADD COLUMN IF NOT EXISTS "transaction_id" varchar(128),
        ADD COLUMN IF NOT EXISTS "paid_at" timestamptz,
        ADD COLUMN IF NOT EXISTS "version" integer NOT NULL DEFAULT 1`);
    // A statement of its own: PostgreSQL checks ALTER COLUMN before ADD COLUMN runs.
    await queryRunner.query(`ALTER TABLE "orders" ALTER COLUMN "transaction_id" TYPE varchar(128)`);
    await queryRunner.query(`CREATE UNIQUE INDEX IF NOT EXISTS "uq_orders_order_no" ON "orders" ("order_no")`);
  }

  async down(queryRunner: QueryRunner): Promise<void> {
    await queryRunner.query(`DROP TABLE IF EXISTS "orders"`);
  }
}
