import { describe, expect, it } from '@jest/globals';
import { adapterFromEnv, portFromEnv } from './demo-env.js';

// The demo's README: "an empty value counts as unset". `HTTP_ADAPTER=` stopped the start,
// `PORT=` listened on a random port, `EMBEDDED_PG_PORT=` asked PostgreSQL for port 0 (a
// newcomer following the README, session 27).
describe('the demo environment', () => {
  it('takes an empty value as unset', () => {
    expect(adapterFromEnv({ HTTP_ADAPTER: '' })).toBe('express');
    expect(portFromEnv('PORT', 3000, { PORT: '' })).toBe(3000);
    expect(portFromEnv('EMBEDDED_PG_PORT', 54329, { EMBEDDED_PG_PORT: '' })).toBe(54329);
  });

  it('reads set values and refuses bad ones, naming the variable', () => {
    expect(adapterFromEnv({ HTTP_ADAPTER: 'Fastify' })).toBe('fastify');
    expect(() => adapterFromEnv({ HTTP_ADAPTER: 'koa' })).toThrow(/HTTP_ADAPTER must be "express" or "fastify", got "koa"/);
    expect(portFromEnv('PORT', 3000, { PORT: '3134' })).toBe(3134);
    for (const bad of ['abc', '-1', '65536', '3.5', ' ', '0x1F90', '1e3']) expect(() => portFromEnv('PORT', 3000, { PORT: bad })).toThrow(`PORT must be a port number, got "${bad}"`);
  });
});
