// npm run bench: HTTP throughput and latency of the service against a bare Express 5 baseline,
// measured in the same run on the same machine, at the same concurrency. Prints a table of ratios.
import type { ChildProcess } from 'node:child_process';
import fs from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import { deleteRedisPrefix, uniquePrefix } from '../test/support/harness.js';
import {
  alternating,
  BENCH_KEY,
  CONNECTIONS,
  ROUNDS_NOTE,
  type Result,
  runCreations,
  RUN_TENANTS,
  runsWaiting,
  SECONDS,
  serviceEnv,
  startServer,
  stop,
  waitedNote,
} from './http.js';
import { runBenchmarks } from './runs.js';
import { sandboxCost } from './sandbox.js';
import { dagBenchmarks } from './dag.js';
import { ledgerBenchmarks } from './ledger.js';
import { webhookIntake } from './webhooks.js';
import { auditBenchmarks } from './audit.js';
import { workerScaling } from './workers.js';
import { voiceOverhead } from './voice.js';
import { endToEnd } from './e2e.js';
import { floorBenchmarks } from './floor.js';
import { httpFloor } from './http-floor.js';

/** POST /api/v1/autonomy/run (auth, validation, store, event, tenant slot, enqueue) against bare Express + queue.add. */
async function runCreation(): Promise<[string, Result, Result]> {
  const dataDir = await fs.mkdtemp(path.join(os.tmpdir(), 'svc-bench-runs-'));
  const prefix = uniquePrefix();
  const servers: ChildProcess[] = [];
  const web = await startServer('api/main.ts', {
    ...serviceEnv(dataDir, prefix),
    SERVICE_TENANT_MAX_RUNNING: '10000',
  });
  servers.push(web.child);
  const body = JSON.stringify({ steps: [{ tool: 'message', args: { text: 'noop' } }] });
  try {
    const bare = await startServer('bench/servers/bare-express-queue.ts', { SERVICE_QUEUE_PREFIX: prefix });
    servers.push(bare.child);
    const results = await alternating(
      { url: web.url, requests: runCreations(body) },
      { url: `${bare.url}/api/v1/autonomy/run`, method: 'POST', headers: { 'content-type': 'application/json' }, body },
    );
    return [
      `POST /api/v1/autonomy/run (one no-op step, ${RUN_TENANTS} tenants) vs Express + queue.add, ${ROUNDS_NOTE}${waitedNote(await runsWaiting(web.url))}`,
      ...results,
    ];
  } finally {
    await Promise.all(servers.map(stop));
    await deleteRedisPrefix(prefix);
    await fs.rm(dataDir, { recursive: true, force: true });
  }
}

/**
 * GET and POST /api/v1/automations of the service (`main.ts`, 20 automations stored) against bare Express
 * answering the service's own list and create answers; `between` runs after the GET, on its own servers.
 */
async function automationRoutes(between: () => Promise<[string, Result, Result][]> = async () => []): Promise<[string, Result, Result][]> {
  const dataDir = await fs.mkdtemp(path.join(os.tmpdir(), 'svc-bench-'));
  const prefix = uniquePrefix();
  const service = await startServer('main.ts', {
    ...serviceEnv(dataDir, prefix),
  });
  const servers = [service.child];
  try {
    const auth = { authorization: `Bearer ${BENCH_KEY}`, 'content-type': 'application/json' };
    const definition = JSON.stringify({
      name: 'bench',
      triggers: [{ type: 'cron', schedule: '0 3 * * *', timezone: 'UTC' }],
      steps: [{ tool: 'shell', args: { command: 'true' } }],
    });
    let created: unknown;
    for (let i = 0; i < 20; i++) created = await (await fetch(`${service.url}/api/v1/automations`, { method: 'POST', headers: auth, body: definition })).json();
    const list = await (await fetch(`${service.url}/api/v1/automations?limit=20`, { headers: auth })).json();
    const fixtures = path.join(dataDir, 'fixtures.json');
    await fs.writeFile(fixtures, JSON.stringify({ list, created }));
    const bare = await startServer('bench/servers/bare-express.ts', { PORT: '0', BENCH_FIXTURES: fixtures });
    servers.push(bare.child);
    const rows: [string, Result, Result][] = [];
    rows.push([
      `GET /api/v1/automations (20 items), ${ROUNDS_NOTE}`,
      ...(await alternating(
        { url: `${service.url}/api/v1/automations?limit=20`, method: 'GET', headers: auth },
        { url: `${bare.url}/api/v1/automations`, method: 'GET' },
      )),
    ]);
    rows.push(...(await between()));
    rows.push([
      `POST /api/v1/automations (create), ${ROUNDS_NOTE}`,
      ...(await alternating(
        { url: `${service.url}/api/v1/automations`, method: 'POST', headers: auth, body: definition },
        { url: `${bare.url}/api/v1/automations`, method: 'POST', headers: { 'content-type': 'application/json' }, body: definition },
      )),
    ]);
    return rows;
  } finally {
    await Promise.all(servers.map(stop));
    await deleteRedisPrefix(prefix);
    await fs.rm(dataDir, { recursive: true, force: true });
  }
}

function printHttpRows(rows: [string, Result, Result][]): void {
  const date = new Date().toISOString().slice(0, 10);
  console.log(`\nHTTP benchmarks, ${date}, ${os.cpus().length} cores, ${CONNECTIONS} connections, ${SECONDS} s each, Node ${process.version}\n`);
  console.log('| scenario | service req/s | bare Express req/s | ratio | service p50 / p99 ms | bare p50 / p99 ms | errors + non-2xx |');
  console.log('|---|---|---|---|---|---|---|');
  for (const [name, s, b] of rows) {
    console.log(
      `| ${name} | ${s.rps.toFixed(0)} | ${b.rps.toFixed(0)} | ${(s.rps / b.rps).toFixed(2)} | ${s.p50} / ${s.p99} | ${b.p50} / ${b.p99} | ${s.errors + s.non2xx} |`,
    );
  }
}

/** The tables after the HTTP rows, in the order a full run prints them: each part's header and rows. */
const TABLES: Record<string, { header: string; rows: () => Promise<string[]> }> = {
  runs: { header: '| run engine | service | raw BullMQ | ratio |', rows: runBenchmarks },
  floor: { header: "| the run engine's floor | process CPU a run | Redis CPU a run | rate |", rows: floorBenchmarks },
  'http-floor': { header: '| the HTTP floor | rate | CPU of the server a request | ratio to the baseline |', rows: httpFloor },
  e2e: { header: '| end to end | service (`main.ts`) | Express + queue.add + no-op worker | ratio |', rows: endToEnd },
  dag: { header: '| task DAG | service | BullMQ flow | ratio (goal <= 2x) |', rows: dagBenchmarks },
  ledger: { header: '| evidence ledger | service | baseline | ratio |', rows: ledgerBenchmarks },
  workers: { header: `| ${os.cpus().length} cores, no-op runs | throughput | vs 1 process |`, rows: workerScaling },
  audit: { header: '| workspace audit | service | baseline | ratio |', rows: auditBenchmarks },
  voice: { header: '| voice transcription | service | baseline | service adds |', rows: voiceOverhead },
  sandbox: { header: '| sandbox | bubblewrap | no sandbox | cost |', rows: sandboxCost },
};

async function main(): Promise<void> {
  // the order of the rows as before: GET, run creation, webhooks, then POST automations
  printHttpRows(await automationRoutes(async () => [await runCreation(), ...(await webhookIntake())]));
  for (const { header, rows } of Object.values(TABLES)) {
    console.log(`\n${header}`);
    console.log(`|${'---|'.repeat(header.split('|').length - 2)}`);
    for (const line of await rows()) console.log(line);
  }
}

const only = process.env.BENCH_ONLY;
if (only && TABLES[only]) {
  for (const line of await TABLES[only].rows()) console.log(line);
} else if (only === 'run-creation') {
  printHttpRows([await runCreation()]);
} else if (only === 'api') {
  printHttpRows(await automationRoutes());
} else if (only === 'webhooks') {
  printHttpRows(await webhookIntake());
} else {
  await main();
}
