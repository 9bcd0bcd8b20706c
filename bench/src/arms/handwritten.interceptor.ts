import {
  ConflictException,
  Inject,
  Injectable,
  UseInterceptors,
  applyDecorators,
  SetMetadata,
  type CallHandler,
  type ExecutionContext,
  type NestInterceptor,
} from '@nestjs/common';
import { Reflector } from '@nestjs/core';
import { Redis } from 'ioredis';
import { Observable, catchError, concatMap, of } from 'rxjs';

export const HANDWRITTEN_REDIS = Symbol('HANDWRITTEN_REDIS');
const LEASE_MS = 'bench:handwritten-lease-ms';

interface Saved {
  statusCode: number;
  body: unknown;
}

/**
 * What a team writes by hand: `SET key P NX PX lease` to claim, `SET key <response> PX retention`
 * to complete, `GET` on a duplicate. Two commands per first request and per duplicate; no
 * fingerprint, no owner token (a stale holder can overwrite a newer claim).
 */
@Injectable()
export class HandwrittenInterceptor implements NestInterceptor {
  constructor(
    @Inject(HANDWRITTEN_REDIS) private readonly redis: Redis,
    private readonly reflector: Reflector,
  ) {}

  async intercept(ctx: ExecutionContext, next: CallHandler): Promise<Observable<unknown>> {
    const http = ctx.switchToHttp();
    const req = http.getRequest<{ headers: Record<string, string | undefined> }>();
    const res = http.getResponse<{ statusCode: number }>();
    const clientKey = req.headers['idempotency-key'];
    if (!clientKey) return next.handle();
    const key = `hw:${ctx.getClass().name}.${ctx.getHandler().name}:${clientKey}`;
    const leaseMs = this.reflector.get<number | undefined>(LEASE_MS, ctx.getHandler()) ?? 30_000;

    if ((await this.redis.set(key, 'P', 'PX', leaseMs, 'NX')) === null) {
      const value = await this.redis.get(key);
      if (value === null || value === 'P') throw new ConflictException('in progress');
      return of((JSON.parse(value) as Saved).body);
    }
    return next.handle().pipe(
      concatMap(async (body: unknown) => {
        const saved: Saved = { statusCode: res.statusCode, body };
        await this.redis.set(key, JSON.stringify(saved), 'PX', 86_400_000);
        return body;
      }),
      catchError(async (error: unknown) => {
        await this.redis.del(key);
        throw error;
      }),
    );
  }
}

/** `@Handwritten({ leaseMs })`: the hand-written guard on one handler. */
export function Handwritten(leaseMs = 30_000): MethodDecorator {
  return applyDecorators(SetMetadata(LEASE_MS, leaseMs), UseInterceptors(HandwrittenInterceptor));
}
