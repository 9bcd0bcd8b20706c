import {
  Injectable,
  Module,
  UseInterceptors,
  type CallHandler,
  type DynamicModule,
  type NestInterceptor,
  type Provider,
} from '@nestjs/common';
import { Redis } from 'ioredis';
import { of } from 'rxjs';
import {
  IdempotencyModule,
  NoRepeatSubmit,
  REDIS_CLIENT_DEFAULTS,
  type IdempotencyModuleOptions,
} from '../../../libs/idempotency/src/index.js';
import type { ArmName } from '../arm-names.js';
import { HANDWRITTEN_REDIS, Handwritten, HandwrittenInterceptor } from './handwritten.interceptor.js';
import { HandlerRuns, ordersController, unguarded } from './orders.controller.js';
import { loadPeer } from './peer.js';
import { createPostgresStore } from './postgres-arm.js';

export interface ArmSettings {
  redisUrl: string;
  databaseUrl: string;
  /** Schema of the PostgreSQL arm's tables (the driver creates it). */
  postgresSchema?: string;
  /** The crash route's lease (guard, hand-written), seconds; the default 30 s elsewhere. */
  crashLeaseSeconds: number;
}

/** Retention of every arm: the peer's default (24 h), so all arms keep responses alike. */
const RETENTION_SECONDS = 86_400;

@Module({})
class ArmModule {}

/** Passes every call through: the floor any interceptor-based guard stands on. */
@Injectable()
class EmptyInterceptor implements NestInterceptor {
  intercept(_ctx: unknown, next: CallHandler) {
    return next.handle();
  }
}

/**
 * Answers every call with the endpoint's answer without calling the handler, as a replay does:
 * the floor of any interceptor-based guard's replay (Nest's interceptor pipeline and the
 * adapter's send, nothing looked up, nothing checked).
 */
@Injectable()
class AnsweringInterceptor implements NestInterceptor {
  intercept() {
    return of({ id: 1, orderNo: 'ORD-1', amount: 12.5, status: 'PENDING' });
  }
}

/** The Nest module of one arm: the same controller, with that arm's guard around it. */
export async function armModule(arm: ArmName, settings: ArmSettings): Promise<DynamicModule> {
  const providers: Provider[] = [HandlerRuns];
  const imports: DynamicModule[] = [];
  let guard: MethodDecorator = unguarded;
  let crashGuard: MethodDecorator | undefined;

  const useGuard = (store: IdempotencyModuleOptions['store'], localCache = false) => {
    imports.push(IdempotencyModule.forRoot({ store, expireSeconds: RETENTION_SECONDS, localCache }));
    guard = NoRepeatSubmit();
    crashGuard = NoRepeatSubmit({ leaseSeconds: settings.crashLeaseSeconds });
  };
  const { hostname, port } = new URL(settings.redisUrl);

  switch (arm) {
    case 'bare':
      break;
    case 'empty-interceptor':
      // What any interceptor costs in Nest (its rxjs pipeline), before the guard does anything.
      providers.push(EmptyInterceptor);
      guard = UseInterceptors(EmptyInterceptor);
      break;
    case 'answering-interceptor':
      providers.push(AnsweringInterceptor);
      guard = UseInterceptors(AnsweringInterceptor);
      break;
    case 'guard-redis':
    case 'guard-redis-raw-body':
      useGuard({ redis: settings.redisUrl });
      break;
    case 'guard-redis-local-cache':
      useGuard({ redis: settings.redisUrl }, true);
      break;
    case 'guard-redis-autopipe':
      useGuard({ redis: { host: hostname, port: Number(port), enableAutoPipelining: true } });
      break;
    case 'guard-redis-uncorked': {
      // A client passed in is used as it is: ioredis writes each command on its own.
      const client = new Redis(settings.redisUrl, REDIS_CLIENT_DEFAULTS);
      client.on('error', () => undefined);
      useGuard({ redis: client });
      break;
    }
    case 'guard-memory':
      useGuard(undefined);
      break;
    case 'guard-postgres':
      useGuard(await createPostgresStore(settings.databaseUrl, settings.postgresSchema));
      break;
    case 'peer-redis': {
      const peer = loadPeer();
      imports.push(
        peer.NodeIdempotencyModule.forRootAsync({
          storage: { adapter: 'redis', options: { url: settings.redisUrl } },
          cacheTTLMS: RETENTION_SECONDS * 1000,
        }),
      );
      guard = peer.Idempotent();
      break;
    }
    case 'handwritten':
      providers.push(
        { provide: HANDWRITTEN_REDIS, useFactory: () => new Redis(settings.redisUrl, { maxRetriesPerRequest: 0 }) },
        HandwrittenInterceptor,
      );
      guard = Handwritten();
      crashGuard = Handwritten(settings.crashLeaseSeconds * 1000);
      break;
  }

  return {
    module: ArmModule,
    imports,
    controllers: [ordersController(guard, crashGuard)],
    providers,
  };
}
