import { describe, expect, it } from '@jest/globals';
import { Controller } from '@nestjs/common';
import { ExecutionContextHost } from '@nestjs/core/helpers/execution-context-host.js';
import { EventPattern, MessagePattern, MqttContext, NatsContext } from '@nestjs/microservices';
import { GuardMemory } from './guard-memory.js';
import type { GuardedRoute } from './route-options.js';
import { RpcExchange } from './rpc-exchange.js';

@Controller()
class Handlers {
  @MessagePattern('orders/create')
  plain() {}

  @MessagePattern('$share/workers/orders/create')
  shared() {}

  @EventPattern('shops/+/orders')
  plainWildcard(_data: unknown) {}

  @EventPattern('$share/workers/shops/+/orders')
  sharedWildcard(_data: unknown) {}

  @MessagePattern('$share/workers/orders/create')
  sharedOnNats() {}
}

/** The handler segment of the key a message to `method` on `topic` (MQTT) gets. */
async function keyHandlerOf(method: keyof Handlers, context: object): Promise<string> {
  const ctx = new ExecutionContextHost([{}, context], Handlers, Handlers.prototype[method]);
  ctx.setType('rpc');
  const route = { handler: `Handlers.${method}` } as GuardedRoute;
  return (await RpcExchange.create(ctx, route, new GuardMemory())).keyHandler();
}

const mqtt = (topic: string) => new MqttContext([topic, {} as never]);

// helper-210: Nest subscribes `$share/<group>/<topic>` and hands the handler the topic alone, so
// the declared pattern never matched it: keyed as a wildcard (`Handlers.shared#orders/create`),
// a plain instance and a `$share` one of one app (a rolling switch to shared subscriptions)
// each ran the message once.
describe('RpcExchange.keyHandler, MQTT shared subscriptions', () => {
  it('keys a $share/<group>/ pattern as the pattern without it: by the handler alone, or what a wildcard matched', async () => {
    expect(await keyHandlerOf('plain', mqtt('orders/create'))).toBe('Handlers.plain');
    expect(await keyHandlerOf('shared', mqtt('orders/create'))).toBe('Handlers.shared');
    expect(await keyHandlerOf('plainWildcard', mqtt('shops/7/orders'))).toBe('Handlers.plainWildcard#shops/7/orders');
    expect(await keyHandlerOf('sharedWildcard', mqtt('shops/7/orders'))).toBe('Handlers.sharedWildcard#shops/7/orders');
  });

  it('leaves a subject that only looks like one alone on another transport (NATS keeps it as written)', async () => {
    expect(await keyHandlerOf('sharedOnNats', new NatsContext(['$share/workers/orders/create', undefined]))).toBe('Handlers.sharedOnNats');
    expect(await keyHandlerOf('sharedOnNats', new NatsContext(['orders/create', undefined]))).toBe('Handlers.sharedOnNats#orders/create');
  });
});
