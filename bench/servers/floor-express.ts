// The HTTP floor (BENCH_ONLY=http-floor): a bare Express 5 app that does only what issue 14 says the service
// may not give up on a create, each part the service's own code, so the bench can say how much of the gap
// to bare Express the parts alone take. BENCH_FLOOR lists the parts, in the order a request meets them:
//  - auth: the presented key's sha256 and its row read from the store by that hash (the bench tenants' keys seeded)
//  - validate: express-openapi-validator configured as the API configures it, with the service's spec
//  - store: the created document written to the real SQLite store through its group commit, before the answer
//  - run (run creation only): what SPEC and DESIGN ask of a run beyond it: its session record in the same commit,
//    the tenant's slot taken (the engine's Lua) and its `run.queued` event appended, before its job is added
// and for POST /api/v1/autonomy/run always `queue.add` (the baseline's one job); an automation is stored
// under the tenant's cap as the service stores it. With no parts it is the baselines themselves.
import fs from 'node:fs';
import os from 'node:os';
import path from 'node:path';
import express, { type RequestHandler } from 'express';
import { Queue } from 'bullmq';
import { Redis } from 'ioredis';
import { requestValidator } from '../../api/app.js';
import { loadSpec } from '../../api/spec.js';
import { hashKey } from '../../engine/auth/api-keys.js';
import { createEventLog, newId, type Automation } from '../../engine/platform/index.js';
import { createTenantSlots } from '../../engine/runs/concurrency.js';
import { openSqliteStore } from '../../engine/store/sqlite/index.js';
import { runFixture } from '../../test/integration/store-contract.js';
import { RUN_KEYS, runTenant } from '../http.js';

const parts = new Set((process.env.BENCH_FLOOR ?? '').split(',').filter(Boolean));
const unknown = [...parts].filter((p) => !['auth', 'validate', 'store', 'run'].includes(p));
if (unknown.length) throw new Error(`BENCH_FLOOR: no part ${unknown.join(', ')} (auth, validate, store, run)`);

// BENCH_FLOOR_DIR: a folder the bench removes itself (it stops this server with SIGKILL, so no clean-up here runs)
const dir = fs.mkdtempSync(path.join(process.env.BENCH_FLOOR_DIR ?? os.tmpdir(), 'svc-bench-http-floor-'));
const store = openSqliteStore(path.join(dir, 'service.db'));
const connection = new Redis(process.env.REDIS_URL ?? 'redis://127.0.0.1:6379', { maxRetriesPerRequest: null });
const prefix = process.env.SERVICE_QUEUE_PREFIX ?? 'bench-floor';
const queue = new Queue('bare', { connection, prefix });
const eventLog = createEventLog(connection, `${prefix}:floor`);
const slots = createTenantSlots(connection, `${prefix}:floor`, 1_000_000);
const now = new Date().toISOString();
// the keys of the service's bench tenants (run creation spreads over them); one row each, as the service keeps
for (const [i, key] of RUN_KEYS.entries())
  await store.apiKeys.insert({
    id: newId('key'),
    tenant_id: runTenant(i),
    hash: hashKey(key),
    label: null,
    source: 'bootstrap',
    expires_at: null,
    created_by: null,
    created_at: now,
    last_used_at: now,
    revoked_at: null,
    revoked_reason: null,
  });

const app = express();
// as the service routes (api/app.ts): the validator's route lookup depends on it
app.set('case sensitive routing', true);
if (parts.has('auth'))
  app.use('/api/v1', (async (req, _res, next) => {
    const presented = /^Bearer (.+)$/.exec(req.headers.authorization ?? '')?.[1];
    const key = presented ? await store.apiKeys.findByHash(hashKey(presented)) : null;
    if (!key) throw new Error('unauthorized');
    (req as { tenantId?: string }).tenantId = key.tenant_id;
    next();
  }) as RequestHandler);
app.use(express.json({ limit: '1mb' }));
if (parts.has('validate')) app.use(requestValidator(loadSpec(), false));

app.post('/api/v1/autonomy/run', async (req, res) => {
  const run = runFixture('bench', { kind: 'autonomy', plan: (req.body as { steps: never[] }).steps, tool_allowlist: ['message'], workspace: dir });
  if (parts.has('run')) {
    const at = run.created_at;
    const session = { id: run.session_id, tenant_id: run.tenant_id, title: '1 step', goal: null, kind: 'autonomy' as const, status: 'running' as const };
    await Promise.all([
      store.runs.insert(run),
      store.sessions.insert({ ...session, outcome: null, metadata: { run_id: run.id }, created_at: at, updated_at: at }),
    ]);
    const [admitted] = await Promise.all([
      slots.admit(run.tenant_id, run.id),
      eventLog.append(`session:${run.session_id}`, {
        tenant_id: run.tenant_id,
        session_id: run.session_id,
        run_id: run.id,
        type: 'run.queued',
        data: { kind: 'autonomy', trigger: run.trigger, attempt: 1, rerun_of: null },
      }),
    ]);
    if (!admitted) throw new Error('over the slots');
  } else if (parts.has('store')) await store.runs.insert(run);
  await queue.add('run', { run_id: run.id }, { jobId: run.id, removeOnComplete: true });
  const events = `/api/v1/autonomy/streaming/${run.session_id}/events`;
  res.status(202).json({ run_id: run.id, session_id: run.session_id, status: run.status, events_url: events, run });
});

app.post('/api/v1/automations', async (req, res) => {
  const body = req.body as Pick<Automation, 'name' | 'triggers' | 'steps'>;
  const automation: Automation = {
    id: newId('aut'),
    tenant_id: 'bench',
    name: body.name,
    description: null,
    status: 'enabled',
    triggers: body.triggers,
    tool_allowlist: ['shell'],
    network: false,
    budget: { seconds: 600 },
    retry: null,
    steps: body.steps,
    goal: null,
    inputs: {},
    template: null,
    created_at: now,
    updated_at: now,
  };
  if (parts.has('store') && (await store.automations.insert(automation, { maxLive: 1_000_000 })) !== 'inserted') throw new Error('over the cap');
  res.status(201).json(automation);
});

const server = app.listen(0, '127.0.0.1', () => {
  const address = server.address();
  process.stdout.write(`listening on http://127.0.0.1:${typeof address === 'object' && address ? address.port : 0}\n`);
});
process.on('SIGTERM', () =>
  server.close(
    () =>
      void queue
        .close()
        .then(() => store.close())
        .then(() => fs.rmSync(dir, { recursive: true, force: true }))
        .then(() => process.exit(0)),
  ),
);
