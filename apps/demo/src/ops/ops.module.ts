import { Module } from '@nestjs/common';
import { TerminusModule } from '@nestjs/terminus';
import { IdempotencyHealthIndicator } from 'nestjs-idempotency/health';
import { HealthController } from './health.controller.js';
import { MetricsController } from './metrics.controller.js';

/** What operators scrape and probe: `/metrics` and `/health`. (`/docs` is set up in the factory.) */
@Module({
  imports: [TerminusModule.forRoot({ logger: false })],
  controllers: [HealthController, MetricsController],
  providers: [IdempotencyHealthIndicator],
})
export class OpsModule {}
