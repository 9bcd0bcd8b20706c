import { randomUUID } from 'node:crypto';
import type { AdapterName } from '../arm-names.js';
import type { LoopDelay } from '../arms/demo-server.js';
import { startDemo, type ArmEnvironment } from '../driver/processes.js';
import type { Progress } from '../driver/progress.js';
import { histogram } from '../driver/stats.js';

/** The demo's JSON body limit (`BODY_LIMIT_BYTES`): the hostile bodies fill it. */
const BODY_LIMIT_BYTES = 1024 * 1024;

interface BadInputCase {
  name: string;
  /** `:order` stands for an order the phase creates first. */
  path: string;
  contentType: string;
  body: string;
}

export interface BadInputResult {
  adapter: AdapterName;
  case: string;
  bytes: number;
  /** `413 PAYLOAD_TOO_COMPLEX` × n: the answers' status and code. */
  answers: Record<string, number>;
  /** Slowest answer the client waited for, ms. */
  slowestMs: number;
  /** Longest the demo process's event loop went without turning during the case, ms: every other request waited that long. */
  worstStallMs: number;
}

/** `{<fields>,"k0":0,"k1":0,...}`: as many unknown keys as fit in the body limit (~95,000). */
function manyKeys(fields: string): string {
  const parts = [`{${fields}`];
  let bytes = parts[0].length + 1;
  for (let i = 0; bytes + 12 < BODY_LIMIT_BYTES; i++) {
    const part = `,"k${i}":0`;
    parts.push(part);
    bytes += part.length;
  }
  return `${parts.join('')}}`;
}

const CALLBACK = '"transactionId":"tx-1","paidAt":"2026-11-30T10:00:00Z"';

function cases(): BadInputCase[] {
  const orderNo = () => `BENCH-${randomUUID().slice(0, 8)}`;
  const json = (name: string, path: string, body: string): BadInputCase => ({ name, path, contentType: 'application/json', body });
  return [
    json('a valid order (the baseline)', '/orders', JSON.stringify({ orderNo: orderNo(), amount: 1 })),
    json('~95,000 unknown keys (1 MiB), POST /orders', '/orders', manyKeys(`"orderNo":"${orderNo()}","amount":1`)),
    json('~95,000 unknown keys (1 MiB), payment callback', '/orders/:order/payment-callback', manyKeys(CALLBACK)),
    json('~95,000 keys in a nested object, payment callback', '/orders/:order/payment-callback', manyKeys(`${CALLBACK},"x":{"k":0`).replace(/}$/, '}}')),
    json('JSON nested 5,000 levels, payment callback', '/orders/:order/payment-callback', `{${CALLBACK},"x":${'{"a":'.repeat(5000)}1${'}'.repeat(5000)}}`),
    json('an array of 300,000 numbers, POST /orders', '/orders', JSON.stringify({ orderNo: orderNo(), amount: 1, items: new Array(300_000).fill(0) })),
    {
      name: 'XML with a tag name of 1,000,000 characters, POST /uploads/xml',
      path: '/uploads/xml',
      contentType: 'application/xml',
      body: `<receipt><9${'x'.repeat(1_000_000)}/></receipt>`,
    },
  ];
}

/** Bodies per adapter (for the progress plan). */
export const BAD_INPUT_CASES = cases().length;

/**
 * For each adapter, the demo app itself (`apps/demo`, its guards, pipe and exception filter) in
 * its own process; each hostile body is sent `repeats` times, one at a time, and the demo
 * process reports the worst event-loop stall it saw meanwhile (`monitorEventLoopDelay`, reset
 * before each case). A stall holds every other request of the process, so it is the figure
 * that matters; the answers (status and code) show where the body was refused.
 */
export async function badInputPhase(
  adapters: readonly AdapterName[],
  env: ArmEnvironment,
  repeats: number,
  progress: Progress,
): Promise<BadInputResult[]> {
  const results: BadInputResult[] = [];
  for (const adapter of adapters) {
    progress.show(`bad input: starting the demo app on ${adapter}`);
    const demo = await startDemo(adapter, env, `bench-bad-input-${randomUUID()}`);
    try {
      const order = `BENCH-${randomUUID().slice(0, 8)}`;
      const created = await send(`${demo.url}/orders`, 'application/json', JSON.stringify({ orderNo: order, amount: 1 }));
      if (created.status !== 201) throw new Error(`the demo app did not create the phase's order: ${created.status} ${created.code}`);
      for (const c of cases()) {
        progress.show(`bad input ${adapter}: ${c.name}`);
        await demo.ask({ type: 'reset' }, 'reset');
        const answers: Record<string, number> = {};
        let slowestMs = 0;
        for (let i = 0; i < repeats; i++) {
          const answer = await send(`${demo.url}${c.path.replace(':order', order)}`, c.contentType, c.body);
          const label = `${answer.status}${answer.code ? ` ${answer.code}` : ''}`;
          answers[label] = (answers[label] ?? 0) + 1;
          slowestMs = Math.max(slowestMs, answer.ms);
        }
        const loop = await demo.ask<LoopDelay>({ type: 'read' }, 'loop');
        results.push({ adapter, case: c.name, bytes: Buffer.byteLength(c.body), answers, slowestMs, worstStallMs: loop.worstStallMs });
        progress.step(`bad input ${adapter}: ${c.name}`);
      }
    } finally {
      await demo.kill();
    }
  }
  return results;
}

async function send(url: string, contentType: string, body: string): Promise<{ status: number; code?: string; ms: number }> {
  const started = performance.now();
  const res = await fetch(url, { method: 'POST', headers: { 'content-type': contentType, 'x-user-id': 'bench' }, body });
  const text = await res.text();
  const ms = performance.now() - started;
  let code: string | undefined;
  try {
    code = (JSON.parse(text) as { code?: string }).code;
  } catch {
    code = undefined;
  }
  return { status: res.status, code, ms };
}

const fmt = (ms: number) => (ms >= 1000 ? `${(ms / 1000).toFixed(1)} s` : `${Math.round(ms)} ms`);

export function badInputTable(results: readonly BadInputResult[], repeats: number): string {
  const lines = ['| adapter | body | bytes | answers | slowest answer | worst event-loop stall |', '|---|---|---:|---|---:|---:|'];
  for (const r of results) {
    lines.push(`| ${r.adapter} | ${r.case} | ${r.bytes.toLocaleString('en-US')} | ${histogram(r.answers)} | ${fmt(r.slowestMs)} | **${fmt(r.worstStallMs)}** |`);
  }
  lines.push(
    '',
    `Each body sent ${repeats} × in a row to the demo app (\`apps/demo\`, its own process, the bench's Redis as its store). ` +
      'Worst stall: `monitorEventLoopDelay` max in the demo process over the case, less its 5 ms sampling interval; every request the process holds waits that long.',
  );
  return lines.join('\n');
}
