import type { AdapterName, ArmName } from '../arm-names.js';
import { runLoad } from '../driver/load.js';
import { handlerRuns, type ArmProcess } from '../driver/processes.js';
import type { Progress } from '../driver/progress.js';
import { addCounts } from '../driver/stats.js';
import { ORDER_BODY } from './throughput.js';

export const STORM_REQUESTS = 500;
export const STORM_CONCURRENCY = 200;

export interface StormResult {
  adapter: AdapterName;
  arm: ArmName;
  processes: 1 | 2;
  requests: number;
  /** Business effects: how many times the handler ran for one logical request. */
  handlerRuns: number;
  statuses: Record<string, number>;
  errors: number;
}

/**
 * 500 identical requests (one key, one body), 200 in flight at a time, at one process of the arm
 * and then at two processes sharing its store (half the requests and connections each). The
 * handler works 20 ms, so duplicates arrive while the first request runs.
 */
export async function stormPhase(
  instances: Map<AdapterName, Map<ArmName, [ArmProcess, ArmProcess]>>,
  progress: Progress,
): Promise<StormResult[]> {
  const results: StormResult[] = [];
  const runId = Date.now().toString(36);
  for (const [adapter, arms] of instances) {
    for (const [arm, pair] of arms) {
      for (const processes of [1, 2] as const) {
        progress.show(`storm ${adapter} ${arm} ×${processes}`);
        const targets = pair.slice(0, processes);
        const key = `storm-${runId}-${arm}-${adapter}-${processes}`;
        const before = await Promise.all(targets.map(handlerRuns));
        const loads = await Promise.all(
          targets.map((target) =>
            runLoad({
              url: `${target.url}/storm`,
              headers: { 'idempotency-key': key, 'x-request-id': '[<id>]' },
              body: ORDER_BODY,
              connections: STORM_CONCURRENCY / processes,
              amount: STORM_REQUESTS / processes,
            }),
          ),
        );
        const after = await Promise.all(targets.map(handlerRuns));
        const statuses: Record<string, number> = {};
        for (const load of loads) addCounts(statuses, load.statuses);
        results.push({
          adapter,
          arm,
          processes,
          requests: loads.reduce((sum, load) => sum + load.requests, 0),
          handlerRuns: after.reduce((sum, runs, i) => sum + runs.storms - before[i].storms, 0),
          statuses,
          errors: loads.reduce((sum, load) => sum + load.errors, 0),
        });
        progress.step(`storm ${adapter} ${arm} ×${processes}`);
      }
    }
  }
  return results;
}
