// A separate entry point: it needs @nestjs/terminus, an optional peer of the library.
export { IdempotencyHealthIndicator } from './idempotency-health.indicator.js';
