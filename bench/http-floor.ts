// npm run bench (the HTTP floor, BENCH_ONLY=http-floor): how much of the service's gap to bare Express on
// its two create routes the parts issue 14 does not let it give up take alone. For each route, at the same
// load: the baseline; bench/servers/floor-express.ts answering what the service answers, then with the parts
// added one at a time (the key's hash and row, express-openapi-validator as the API configures it, the
// store's write before the answer); and the service. All are started first, then loaded one after another
// in ROUNDS alternating rounds (the machine's speed drifts within minutes); each row gives the medians of
// the rate and of the server's CPU a request (from /proc).
import type { ChildProcess } from 'node:child_process';
import fs from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import { deleteRedisPrefix, uniquePrefix } from '../test/support/harness.js';
import { BENCH_KEY, load, type Result, runCreations, runsWaiting, serviceEnv, startServer, stop, waitedNote } from './http.js';

const ROUNDS = Number(process.env.BENCH_ROUNDS ?? 3);
const SECONDS = Number(process.env.BENCH_FLOOR_SECONDS ?? 5);

type Route = { name: string; path: string; body: string; service: 'api/main.ts' | 'main.ts'; baseline: string };

const ROUTES: Route[] = [
  {
    name: 'POST /api/v1/autonomy/run',
    path: '/api/v1/autonomy/run',
    body: JSON.stringify({ steps: [{ tool: 'message', args: { text: 'noop' } }] }),
    service: 'api/main.ts',
    baseline: 'Express + `queue.add`',
  },
  {
    name: 'POST /api/v1/automations',
    path: '/api/v1/automations',
    body: JSON.stringify({
      name: 'bench',
      triggers: [{ type: 'cron', schedule: '0 3 * * *', timezone: 'UTC' }],
      steps: [{ tool: 'shell', args: { command: 'true' } }],
    }),
    service: 'main.ts',
    baseline: 'bare Express',
  },
];

/** The floor's parts, added one at a time. */
const STEPS = [
  { parts: '', label: 'Express answering what the service answers' },
  { parts: 'auth', label: "+ the key's hash and row" },
  { parts: 'auth,validate', label: '+ express-openapi-validator' },
  { parts: 'auth,validate,store', label: "+ the store's write: the floor" },
];
/** Run creation's own step past the floor: what SPEC and DESIGN ask of every run (see floor-express.ts). */
const RUN_STEP = { parts: 'auth,validate,run', label: "+ the run's session record, tenant slot and `run.queued` event: the contract's floor" };

const median = (xs: number[]) => [...xs].sort((a, b) => a - b)[Math.floor(xs.length / 2)]!;

async function routeRows(route: Route): Promise<string[]> {
  const runCreation = route.path === '/api/v1/autonomy/run';
  const dataDir = await fs.mkdtemp(path.join(os.tmpdir(), 'svc-bench-http-floor-'));
  const prefix = uniquePrefix();
  const children: ChildProcess[] = [];
  const start = async (label: string, entry: string, env: Record<string, string>, auth: boolean) => {
    const server = await startServer(entry, env);
    children.push(server.child);
    return { label, server, auth, results: [] as Result[] };
  };
  try {
    // the automations baseline answers the service's own create answer, as the api bench's does
    const fixtures = path.join(dataDir, 'fixtures.json');
    await fs.writeFile(fixtures, JSON.stringify({ list: [], created: JSON.parse(route.body) }));
    const servers = [
      route.service === 'api/main.ts'
        ? await start(route.baseline, 'bench/servers/bare-express-queue.ts', { SERVICE_QUEUE_PREFIX: prefix }, false)
        : await start(route.baseline, 'bench/servers/bare-express.ts', { PORT: '0', BENCH_FIXTURES: fixtures }, false),
    ];
    for (const step of runCreation ? [...STEPS, RUN_STEP] : STEPS)
      servers.push(
        await start(step.label, 'bench/servers/floor-express.ts', { SERVICE_QUEUE_PREFIX: prefix, BENCH_FLOOR: step.parts, BENCH_FLOOR_DIR: dataDir }, true),
      );
    servers.push(
      await start('the service', route.service, { ...serviceEnv(path.join(dataDir, 'service'), prefix), SERVICE_TENANT_MAX_RUNNING: '10000' }, true),
    );
    for (let round = 0; round < ROUNDS; round++)
      for (const s of servers)
        s.results.push(
          await load({
            ...(runCreation
              ? // every run admitted and enqueued, as the baseline's job is: see RUN_KEYS (a server without auth ignores the key)
                { url: s.server.url, requests: runCreations(route.body) }
              : {
                  url: `${s.server.url}${route.path}`,
                  method: 'POST',
                  headers: { 'content-type': 'application/json', ...(s.auth ? { authorization: `Bearer ${BENCH_KEY}` } : {}) },
                  body: route.body,
                }),
            pid: s.server.child.pid,
            warmUp: round === 0,
            seconds: SECONDS,
          }),
        );
    const service = servers.at(-1)!;
    if (runCreation) service.label += waitedNote(await runsWaiting(service.server.url));
    const baseRate = median(servers[0]!.results.map((r) => r.rps));
    return servers.map((s) => {
      const rate = median(s.results.map((r) => r.rps));
      const failed = s.results.reduce((n, r) => n + r.errors + r.non2xx, 0);
      return (
        `| ${route.name}: ${s.label} | ${rate.toFixed(0)} req/s | ${median(s.results.map((r) => r.cpuUsPerRequest!)).toFixed(0)} µs | ` +
        `${(rate / baseRate).toFixed(2)} |${failed ? ` ${failed} errors or non-2xx` : ''}`
      );
    });
  } finally {
    await Promise.all(children.map(stop));
    await deleteRedisPrefix(prefix);
    await fs.rm(dataDir, { recursive: true, force: true });
  }
}

export async function httpFloor(): Promise<string[]> {
  const lines: string[] = [];
  for (const route of ROUTES) lines.push(...(await routeRows(route)));
  return lines;
}
