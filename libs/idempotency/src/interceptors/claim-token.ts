import { randomUUID } from 'node:crypto';

const PROCESS_ID = randomUUID();
let claims = 0;

/**
 * A fresh token for a claim (the claim holder's proof, for fencing): this process's random id and a counter, unique across
 * attempts and processes. It never leaves the server (clients cannot complete or release), so
 * it must be unique, not unguessable; a UUID per request cost about 0.3 µs more.
 */
export function claimToken(): string {
  return `${PROCESS_ID}.${(++claims).toString(36)}`;
}
