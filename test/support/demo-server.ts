import type { INestApplication } from '@nestjs/common';
import { createDemoApp, type DemoAppOptions } from '../../apps/demo/src/demo-app.factory.js';

export interface ListeningDemo {
  app: INestApplication;
  /** `http://127.0.0.1:<port>`, for real parallel requests with fetch. */
  baseUrl: string;
}

/** The demo app listening on a free loopback port (errors only in the log unless `logger` says otherwise). */
export async function listenDemo(options: DemoAppOptions): Promise<ListeningDemo> {
  const app = await createDemoApp({ logger: ['error'], ...options });
  await app.listen(0, '127.0.0.1');
  return { app, baseUrl: (await app.getUrl()).replace('[::1]', '127.0.0.1') };
}

export interface FetchedAnswer<B = Record<string, unknown>> {
  status: number;
  replayed: string | null;
  body: B;
}

/** A POST with a JSON body through fetch (undici, one connection per request under load). */
export async function postJson<B = Record<string, unknown>>(
  url: string,
  body: unknown,
  headers: Record<string, string> = {},
): Promise<FetchedAnswer<B>> {
  const res = await fetch(url, {
    method: 'POST',
    headers: { 'content-type': 'application/json', ...headers },
    body: JSON.stringify(body),
  });
  return { status: res.status, replayed: res.headers.get('idempotent-replayed'), body: (await res.json()) as B };
}
