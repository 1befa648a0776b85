// Webhook intake: signed codehost deliveries against the service's web process (verify, rate limit,
// replay check, store, queue.add) and against a bare Express 5 route doing only queue.add, in the
// same run: first paced at a steady 200 req/s for the acknowledgement latency, then flat out at 50
// connections for throughput.
import autocannon from 'autocannon';
import { createHmac, randomUUID } from 'node:crypto';
import type { ChildProcess } from 'node:child_process';
import fs from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import { deleteRedisPrefix, uniquePrefix } from '../test/support/harness.js';
import { alternating, BENCH_KEY, paced, ROUNDS_NOTE, type Result, SECONDS, serviceEnv, startServer, stop } from './http.js';

const SECRET = 'bench-codehost-secret-0123456789';

const ROUTE = '/webhooks/bench/codehost';

/** Every request is a new delivery (new id, new body, new signature): a repeat would be refused as a replay. */
function delivery() {
  const id = randomUUID();
  const body = JSON.stringify({ ref: 'refs/heads/main', after: id, repository: { full_name: 'acme/app' }, pusher: { name: 'bench' } });
  return {
    path: ROUTE,
    body,
    headers: {
      'content-type': 'application/json',
      'x-github-event': 'push',
      'x-github-delivery': id,
      'x-hub-signature-256': `sha256=${createHmac('sha256', SECRET).update(body).digest('hex')}`,
    },
  };
}

const signedDeliveries = (): autocannon.Request[] => [{ method: 'POST', path: ROUTE, setupRequest: (req) => ({ ...req, ...delivery() }) }];

export async function webhookIntake(): Promise<[string, Result, Result][]> {
  const dataDir = await fs.mkdtemp(path.join(os.tmpdir(), 'svc-bench-webhooks-'));
  const prefix = uniquePrefix();
  const servers: ChildProcess[] = [];
  try {
    const web = await startServer('api/main.ts', {
      ...serviceEnv(dataDir, prefix),
      SERVICE_WEBHOOK_RATE_LIMIT_PER_MINUTE: '10000000',
    });
    servers.push(web.child);
    const put = await fetch(`${web.url}/api/v1/webhook-secrets/codehost`, {
      method: 'PUT',
      headers: { authorization: `Bearer ${BENCH_KEY}`, 'content-type': 'application/json' },
      body: JSON.stringify({ secrets: [SECRET] }),
    });
    if (put.status !== 200) throw new Error(`could not set the bench secret: ${put.status} ${await put.text()}`);
    const bare = await startServer('bench/servers/bare-express-webhook.ts', { SERVICE_QUEUE_PREFIX: prefix });
    servers.push(bare.child);
    process.stderr.write('bench: webhook acknowledgement latency at a steady 200 req/s\n');
    const steady: [string, Result, Result] = [
      'the same, paced at a steady 200 req/s: acknowledgement latency',
      await paced({ url: web.url, rate: 200, seconds: SECONDS, request: delivery }),
      await paced({ url: bare.url, rate: 200, seconds: SECONDS, request: delivery }),
    ];
    const throughput: [string, Result, Result] = [
      `POST /webhooks/{tenant}/codehost, signed deliveries, vs Express + queue.add (${ROUNDS_NOTE})`,
      ...(await alternating({ url: web.url, requests: signedDeliveries() }, { url: bare.url, requests: signedDeliveries() })),
    ];
    return [throughput, steady];
  } finally {
    await Promise.all(servers.map(stop));
    await deleteRedisPrefix(prefix);
    await fs.rm(dataDir, { recursive: true, force: true });
  }
}
