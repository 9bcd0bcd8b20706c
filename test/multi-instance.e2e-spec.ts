import { afterAll, beforeAll, describe, expect, it } from '@jest/globals';
import { randomUUID } from 'node:crypto';
import pg from 'pg';
import { startDemoProcess, type DemoProcess } from './support/demo-process.js';
import { DATABASE_URL, REDIS_URL } from './support/services.js';

/** Sends `total` requests with at most `concurrency` in flight, round-robin over the URLs. */
async function load<T>(total: number, concurrency: number, send: (i: number) => Promise<T>): Promise<T[]> {
  const results: T[] = [];
  let next = 0;
  const worker = async () => {
    while (next < total) {
      const i = next++;
      results[i] = await send(i);
    }
  };
  await Promise.all(Array.from({ length: concurrency }, worker));
  return results;
}

describe('two demo processes sharing one Redis and one PostgreSQL', () => {
  let instances: DemoProcess[] = [];
  beforeAll(async () => {
    instances = await Promise.all(
      ['express', 'fastify'].map((adapter) =>
        startDemoProcess({ HTTP_ADAPTER: adapter, DATABASE_URL, REDIS_URL }),
      ),
    );
  }, 60_000);
  afterAll(async () => {
    await Promise.all(instances.map((instance) => instance.stop()));
  });

  it('turns 500 identical orders, 200 at a time, split across the instances, into one order', async () => {
    const orderNo = `MULTI-${randomUUID()}`;
    // A client whose request failed in transit sends it again, as the guard's users' clients do:
    // on a loaded machine a kept-alive connection can close as a request goes out (undici does
    // not resend a POST). Both processes must still be up at the end, and the order one.
    let resent = 0;
    const post = async (url: string, attempt = 1): Promise<Response> => {
      try {
        return await fetch(url, {
          method: 'POST',
          headers: { 'content-type': 'application/json', 'x-user-id': 'multi' },
          body: JSON.stringify({ orderNo, amount: 7 }),
        });
      } catch (error) {
        if (attempt === 3) throw error;
        resent++;
        return post(url, attempt + 1);
      }
    };
    const answers = await load(500, 200, async (i) => {
      const res = await post(`${instances[i % instances.length].baseUrl}/orders`);
      const body = (await res.json()) as { code?: string };
      return { status: res.status, replayed: res.headers.get('idempotent-replayed') === 'true', code: body.code };
    });

    const histogram: Record<string, number> = {};
    for (const a of answers) {
      const label = a.replayed ? `${a.status} replay` : a.code ? `${a.status} ${a.code}` : String(a.status);
      histogram[label] = (histogram[label] ?? 0) + 1;
    }
    console.log(`500 identical POST /orders over 2 processes: ${JSON.stringify(histogram)}, ${resent} sent again after a transport error`);
    for (const instance of instances) {
      expect({ exitCode: instance.process.exitCode, signal: instance.process.signalCode, stderr: instance.stderr() }).toMatchObject({ exitCode: null, signal: null });
    }

    expect(answers.filter((a) => a.status >= 500)).toEqual([]);
    // The first answer is lost when its request is the one sent again (the retry gets its replay).
    const firsts = answers.filter((a) => a.status === 201 && !a.replayed).length;
    expect(firsts).toBe(resent > 0 ? Math.min(firsts, 1) : 1);
    // A 200 would be a duplicate that got past the guard to the database (which answers it with
    // the existing order): with Redis up, the guard alone must stop every duplicate.
    expect(answers.filter((a) => a.status === 200)).toEqual([]);
    for (const a of answers) {
      const expected = a.replayed || a.status === 201 || a.status === 200 || (a.status === 409 && a.code === 'IDEMPOTENCY_IN_PROGRESS');
      expect({ ...a, expected }).toMatchObject({ expected: true });
    }
    const db = new pg.Client({ connectionString: DATABASE_URL });
    await db.connect();
    const { rows } = await db.query('select count(*)::int as n from orders where order_no = $1', [orderNo]);
    await db.end();
    expect(rows[0].n).toBe(1);
  });
});
