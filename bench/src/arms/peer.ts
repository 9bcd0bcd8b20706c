import type { DynamicModule } from '@nestjs/common';
import { requireFromPeers } from '../paths.js';

/** The parts of `@node-idempotency/nestjs` 1.0.4 the bench uses (it is loaded at run time). */
interface PeerModule {
  NodeIdempotencyModule: {
    forRootAsync(options: {
      storage: { adapter: 'redis' | 'memory'; options?: { url: string } };
      cacheTTLMS?: number;
    }): DynamicModule;
  };
  Idempotent(options?: Record<string, unknown>): MethodDecorator;
}

/**
 * `@node-idempotency/nestjs` from bench/peers (installed with legacy-peer-deps: it declares
 * Nest 9/10 only). Its `require('@nestjs/common')` walks up to the project's Nest 12, so the peer
 * and the app share one Nest, as they would in a user's app.
 */
export function loadPeer(): PeerModule {
  return requireFromPeers('@node-idempotency/nestjs') as PeerModule;
}
