import { Controller, Get } from '@nestjs/common';
import { HealthCheck, HealthCheckService, TypeOrmHealthIndicator } from '@nestjs/terminus';
import { IdempotencyHealthIndicator } from 'nestjs-idempotency/health';

/** `GET /health`: 200 when the idempotency store and the database answer, else 503. */
@Controller('health')
export class HealthController {
  constructor(
    private readonly health: HealthCheckService,
    private readonly idempotency: IdempotencyHealthIndicator,
    private readonly database: TypeOrmHealthIndicator,
  ) {}

  @Get()
  @HealthCheck()
  check() {
    return this.health.check([
      () => this.idempotency.isHealthy('idempotency'),
      () => this.database.pingCheck('database', { timeout: 1000 }),
    ]);
  }
}
