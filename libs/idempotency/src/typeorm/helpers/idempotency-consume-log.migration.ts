import type { MigrationInterface, QueryRunner } from 'typeorm';
import { IDEMPOTENCY_CONSUME_LOG_TABLE } from './consume-log.entity.js';
import { entityTable, qualifiedTable } from '../postgres/table-name.js';

/** Creates `idempotency_consume_log`, the table of `consumeOnce` (PostgreSQL). */
export class IdempotencyConsumeLog1764460800001 implements MigrationInterface {
  readonly name = 'IdempotencyConsumeLog1764460800001';

  async up(queryRunner: QueryRunner): Promise<void> {
    const table = qualifiedTable(entityTable(queryRunner.connection.options, IDEMPOTENCY_CONSUME_LOG_TABLE), queryRunner.connection.driver.schema);
    await queryRunner.query(`CREATE TABLE ${table} (
      "consumer" character varying(128) NOT NULL,
      "message_id" character varying(255) NOT NULL,
      "consumed_at" TIMESTAMP WITH TIME ZONE NOT NULL DEFAULT now(),
      CONSTRAINT "pk_idempotency_consume_log" PRIMARY KEY ("consumer", "message_id")
    )`);
  }

  async down(queryRunner: QueryRunner): Promise<void> {
    const table = qualifiedTable(entityTable(queryRunner.connection.options, IDEMPOTENCY_CONSUME_LOG_TABLE), queryRunner.connection.driver.schema);
    await queryRunner.query(`DROP TABLE ${table}`);
  }
}
