import type { HttpAdapterName } from './demo-app.factory.js';

/** The demo's environment variables; an empty value counts as unset (as `VAR= npm start` writes it). */
type Env = Record<string, string | undefined>;

/** `HTTP_ADAPTER`: `express` (default) or `fastify`, in any case. */
export function adapterFromEnv(env: Env = process.env): HttpAdapterName {
  const value = (env.HTTP_ADAPTER || 'express').toLowerCase();
  if (value !== 'express' && value !== 'fastify') {
    throw new Error(`HTTP_ADAPTER must be "express" or "fastify", got "${value}"`);
  }
  return value;
}

/** A port variable: `fallback` when unset or empty; else a whole number from 0 to 65535. */
export function portFromEnv(name: string, fallback: number, env: Env = process.env): number {
  const given = env[name];
  // Digits only: Number(' ') is 0 (a random port), Number('0x1F90') 8080.
  const port = given ? (/^\d+$/.test(given) ? Number(given) : Number.NaN) : fallback;
  if (!Number.isInteger(port) || port < 0 || port > 65535) {
    throw new Error(`${name} must be a port number, got "${given}"`);
  }
  return port;
}
