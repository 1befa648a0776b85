// The workspace audit through the service: its three routes, the flow of four phases (each in the
// sandbox), the report in Redis (expiry, eviction, tenants), the stream (order, resume) and the
// evidence ledger; the `audit` tool through the nightly-audit template.
import { spawnSync } from 'node:child_process';
import http from 'node:http';
import type { AddressInfo } from 'node:net';
import fs from 'node:fs/promises';
import path from 'node:path';
import { expect } from 'chai';
import { EventSource } from 'eventsource';
import { PROJECT_ROOT } from '../../config/paths.js';
import { newId, scopes } from '../../engine/platform/index.js';
import { eventually, finishedRun, KEYS, scanKeys, startHarness, type Harness } from '../support/harness.js';
import { makeFlawedProject, PLANTED_TOKEN } from '../support/projects.js';
import { startWorkers } from '../../workers/index.js';
import { Worker } from 'bullmq';

type Body = Record<string, any>;

const rulesOf = (report: Body, phase: string): string[] => report.phases.find((p: Body) => p.phase === phase).findings.map((f: Body) => f.rule);

/** A registry that knows one package's latest version. */
async function fakeRegistry(): Promise<{ url: string; asked: string[]; close(): Promise<void> }> {
  const asked: string[] = [];
  const server = http.createServer((req, res) => {
    asked.push(decodeURIComponent(req.url!.slice(1)));
    if (req.url === '/semver') res.writeHead(200, { 'content-type': 'application/json' }).end(JSON.stringify({ 'dist-tags': { latest: '8.1.0' } }));
    else res.writeHead(404).end();
  });
  await new Promise<void>((resolve) => server.listen(0, '127.0.0.1', resolve));
  return { url: `http://127.0.0.1:${(server.address() as AddressInfo).port}`, asked, close: () => new Promise((r) => server.close(() => r())) };
}

/** The events of an audit stream through a real SSE client, until its `report` (or an error). */
function watch(url: string, init: { key?: string; lastEventId?: string; headers?: Record<string, string> } = {}) {
  const events: { name: string; id: string; data: Body }[] = [];
  const es = new EventSource(url, {
    fetch: (input, i) =>
      fetch(input, {
        ...i,
        headers: {
          ...(i?.headers as Record<string, string>),
          ...init.headers,
          authorization: `Bearer ${init.key ?? KEYS.a}`,
          ...(init.lastEventId ? { 'last-event-id': init.lastEventId } : {}),
        },
      }),
  });
  let failed: unknown = null;
  for (const name of ['phase_done', 'report'])
    es.addEventListener(name, (e) => {
      events.push({ name, id: e.lastEventId, data: JSON.parse(e.data) });
      if (name === 'report') es.close();
    });
  es.onerror = (e) => {
    failed = e;
    es.close();
  };
  return { es, events, failed: () => failed };
}

describe('workspace audit', function () {
  this.timeout(120_000);
  let h: Harness;
  let registry: Awaited<ReturnType<typeof fakeRegistry>>;
  before(async () => {
    registry = await fakeRegistry();
    h = await startHarness({ env: { SERVICE_AUDIT_REGISTRY_URL: registry.url } });
    await makeFlawedProject(h.tenantDir());
  });
  after(async () => {
    await h.close();
    await registry.close();
  });

  it("runs the four phases on the tenant's workspace and answers the report, with every planted flaw found and no secret shown", async () => {
    const res = await h.call<Body>('POST', '/api/v1/autonomy/workspace-audit/run', { body: { timeout_seconds: 120 } });
    expect(res.status, res.text).to.equal(200);
    const report = res.body;
    expect(report).to.deep.include({ status: 'completed', workspace: '.', phases_requested: ['security', 'architecture', 'sanity', 'health'] });
    expect(report.phases.map((p: Body) => [p.phase, p.status])).to.deep.equal([
      ['security', 'completed'],
      ['architecture', 'completed'],
      ['sanity', 'completed'],
      ['health', 'completed'],
    ]);
    expect(rulesOf(report, 'security')).to.include.members(['secret:github', 'env-file-committed', 'script-pipes-download-to-shell', 'world-writable']);
    expect(rulesOf(report, 'architecture')).to.include.members([
      'import-cycle',
      'orphan-module',
      'undeclared-package',
      'unresolvable-import',
      'layer-violation',
    ]);
    expect(rulesOf(report, 'sanity')).to.include.members(['lockfile-mismatch', 'license-copyleft', 'no-readme', 'no-tests', 'uncommitted-changes']);
    expect(rulesOf(report, 'health')).to.include.members(['marker-todo', 'marker-fixme', 'outdated-major']);
    const health = report.phases.find((p: Body) => p.phase === 'health');
    expect(health.metrics.outdated).to.deep.include({ status: 'checked', outdated: 1 });
    // the gates detected from package.json have never run: the health phase says so
    expect(health.metrics.gates.missing).to.be.at.least(1);
    expect(rulesOf(report, 'health')).to.include('gate-never-run');
    expect(registry.asked).to.include('semver');
    // the token is found and never shown: not in the report, nor in a log line
    expect(JSON.stringify(report)).not.to.contain(PLANTED_TOKEN);
    // a TODO that quotes the token is listed, masked
    expect(report.phases[3].findings.find((f: Body) => f.file === 'src/config.ts' && f.rule === 'marker-todo').message).to.match(/^TODO: rotate \*+ before/);
    expect(h.logs.join('')).not.to.contain(PLANTED_TOKEN);
    const secret = report.phases[0].findings.find((f: Body) => f.rule === 'secret:github' && f.file === 'src/config.ts');
    expect(secret).to.deep.include({ severity: 'critical', line: 1 });
    // totals and scores add up
    const critical = report.phases.reduce((n: number, p: Body) => n + p.counts.critical, 0);
    expect(report.totals.critical).to.equal(critical).and.be.greaterThan(0);
    expect(report.scores.security).to.be.lessThan(100);
    expect(report.scores).to.have.all.keys('security', 'architecture', 'sanity', 'health');

    // the flow: a parent job and a child per phase, named by the report
    const queue = h.rt.queues.get('audits');
    for (const id of ['security', 'architecture', 'sanity', 'health', 'report'])
      expect(await (await queue.getJob(`${report.report_id}__${id}`))?.getState(), id).to.equal('completed');
    // the summary is in the evidence ledger, and names the report
    const entry = (await h.rt.store.evidence.list('tenant-a', { afterSeq: report.ledger.seq - 1, limit: 1 }))[0]!;
    expect(entry).to.deep.include({ kind: 'audit.report', hash: report.ledger.hash });
    expect(entry.subject).to.deep.include({ report_id: report.report_id, workspace: '.' });
    // a re-fetch from the cache is the same report
    const again = await h.call<Body>('GET', `/api/v1/autonomy/workspace-audit/${report.report_id}`);
    expect(again.status).to.equal(200);
    expect(again.body).to.deep.equal(report);
  });

  it("keeps tenants apart: another tenant's report is a 404", async () => {
    const res = await h.call<Body>('POST', '/api/v1/autonomy/workspace-audit/run', { body: { phases: ['sanity'] } });
    expect(res.status, res.text).to.equal(200);
    const other = await h.call<Body>('GET', `/api/v1/autonomy/workspace-audit/${res.body.report_id}`, { key: KEYS.b });
    expect(other.status).to.equal(404);
    expect(other.body.code).to.equal('not-found');
  });

  it('lets a tenant run SERVICE_AUDIT_TENANT_MAX_RUNNING audits at once: one more is a 429 until one ends, and other tenants are not held', async () => {
    const capped = await startHarness({ workers: false, env: { SERVICE_AUDIT_TENANT_MAX_RUNNING: '1' } });
    let workers: Awaited<ReturnType<typeof startWorkers>> | undefined;
    try {
      await fs.writeFile(path.join(capped.tenantDir('tenant-a'), 'README.md'), '# a\n');
      await fs.writeFile(path.join(capped.tenantDir('tenant-b'), 'README.md'), '# b\n');
      const start = (key = KEYS.a) =>
        capped.call<Body>('POST', '/api/v1/autonomy/workspace-audit/run', { key, body: { timeout_seconds: 0, phases: ['sanity'] } });
      const first = await start();
      expect(first.status, first.text).to.equal(202);
      const refused = await Promise.all([start(), start()]);
      for (const r of refused) {
        expect(r.status, r.text).to.equal(429);
        expect(r.body.code).to.equal('rate-limited');
        expect(r.headers.get('retry-after')).to.equal('30');
        expect(r.body.detail).to.contain('SERVICE_AUDIT_TENANT_MAX_RUNNING');
      }
      expect((await start(KEYS.b)).status, 'another tenant has its own places').to.equal(202);
      // nothing was kept of the refused requests: the tenant's list has its one report
      const listed = await capped.rt.engine.audits.reports.listRunning(Date.now(), 100);
      expect(listed.filter((r) => r.tenantId === 'tenant-a').map((r) => r.id)).to.deep.equal([first.body.report_id]);
      workers = await startWorkers(capped.rt);
      await eventually(
        async () => {
          const got = await capped.call<Body>('GET', `/api/v1/autonomy/workspace-audit/${first.body.report_id}`);
          return got.body.status !== 'running';
        },
        'the first audit to end',
        60_000,
      ); // a few seconds alone; several times that beside parallel spec files
      // a finished report still counted running (its process stopped between the two): the reconciler frees its place
      const prefix = capped.config.queuePrefix;
      await capped.rt.redis.zadd(`${prefix}:audit-running:{tenant-a}`, Date.now() - 120_000, first.body.report_id);
      await capped.rt.redis.zadd(`${prefix}:audit-running`, Date.now() - 120_000, `tenant-a\n${first.body.report_id}`);
      expect((await start()).status, 'its place looks taken').to.equal(429);
      await capped.rt.engine.audits.reconcile(60_000);
      expect((await start()).status, 'a place is free again').to.equal(202);
    } finally {
      await workers?.close();
      await capped.close();
    }
  });

  it('runs at most SERVICE_AUDIT_TENANT_CONCURRENCY phases of a tenant at once: another tenant’s audit does not wait behind its queue', async () => {
    // two places a worker, one a tenant: tenant-a's three audits of four phases wait their turns in one place
    const shared = await startHarness({ env: { SERVICE_AUDIT_CONCURRENCY: '2', SERVICE_AUDIT_REGISTRY_URL: 'none' } });
    try {
      expect(shared.config.audit.tenantConcurrency).to.equal(1);
      await makeFlawedProject(shared.tenantDir('tenant-a'));
      await fs.writeFile(path.join(shared.tenantDir('tenant-b'), 'README.md'), '# b\n');
      const a = await Promise.all([1, 2, 3].map(() => shared.call<Body>('POST', '/api/v1/autonomy/workspace-audit/run', { body: { timeout_seconds: 0 } })));
      for (const r of a) expect(r.status, r.text).to.equal(202);
      const places = `${shared.config.queuePrefix}:audit-places:tenant-a`;
      let most = 0;
      const sampler = setInterval(() => void shared.rt.redis.zcard(places).then((n) => (most = Math.max(most, n))), 20);
      try {
        const b = await shared.call<Body>('POST', '/api/v1/autonomy/workspace-audit/run', {
          key: KEYS.b,
          body: { timeout_seconds: 60, phases: ['sanity'] },
        });
        expect(b.status, b.text).to.equal(200);
        // tenant-a's audits are still at it: b's did not wait for their twelve phases
        const states = await Promise.all(
          a.map(async (r) => (await shared.call<Body>('GET', `/api/v1/autonomy/workspace-audit/${r.body.report_id}`)).body.status),
        );
        expect(states, 'tenant-a’s audits when b’s ended').to.include('running');
      } finally {
        clearInterval(sampler);
      }
      expect(most, 'tenant-a’s phases running at once').to.equal(1);
    } finally {
      await shared.close();
    }
  });

  it('matches layer paths in linear time (RE2), so no pattern can hold an audit slot; refuses what RE2 does not take', async () => {
    // a name on which JavaScript's engine backtracks 2^40 times for these patterns (a checker of nested
    // repetitions let the second through)
    const dir = path.join(h.tenantDir(), 'redos');
    await fs.mkdir(dir, { recursive: true });
    await fs.writeFile(path.join(dir, `${'a'.repeat(40)}!.js`), 'export {};\n');
    for (const pattern of ['^(a+)+$', '^(a|a)*$']) {
      const started = Date.now();
      const res = await h.call<Body>('POST', '/api/v1/autonomy/workspace-audit/run', {
        body: { workspace: 'redos', timeout_seconds: 60, phases: ['architecture'], layers: [{ name: 'x', path: pattern }] },
      });
      expect(res.status, res.text).to.equal(200);
      expect(res.body.phases[0]).to.deep.include({ phase: 'architecture', status: 'completed' });
      expect(Date.now() - started, pattern).to.be.below(20_000);
    }
    for (const pattern of ['(?<=a)b', '(a)\\1']) {
      const res = await h.call<Body>('POST', '/api/v1/autonomy/workspace-audit/run', {
        body: { timeout_seconds: 0, phases: ['architecture'], layers: [{ name: 'y', path: pattern }] },
      });
      expect(res.status, pattern).to.equal(400);
      expect(res.body.errors[0]).to.deep.include({ path: '/body/layers' });
    }
  });

  it('answers 202 with where to fetch the report when it is not done in time, and the audit goes on', async () => {
    // layers from the request replace the workspace's audit-layers.json
    const layers = [
      { name: 'db', path: '^src/db/' },
      { name: 'api', path: '^src/api/', may_import: ['db'] },
      { name: 'core', path: '^src/[a-z]+\\.ts$', may_import: [] },
    ];
    const res = await h.call<Body>('POST', '/api/v1/autonomy/workspace-audit/run', {
      body: { timeout_seconds: 0, phases: ['architecture', 'health'], layers },
    });
    expect(res.status, res.text).to.equal(202);
    expect(res.body.status).to.equal('running');
    expect(res.headers.get('location')).to.equal(`/api/v1/autonomy/workspace-audit/${res.body.report_id}`);
    // its stream link follows this audit (a first connection sends no Last-Event-ID): no other audit starts
    const followed = watch(`${h.url}${res.body.stream}`);
    await eventually(() => followed.events.some((e) => e.name === 'report') || followed.failed(), 'the report on the stream', 60_000);
    expect(followed.failed()).to.equal(null);
    expect(new Set(followed.events.map((e) => e.id.split('/')[0]))).to.deep.equal(new Set([res.body.report_id]));
    const done = await eventually(
      async () => {
        const r = await h.call<Body>('GET', res.body.location);
        return r.body.status === 'completed' ? r.body : null;
      },
      'the report',
      60_000,
    );
    expect(done.phases.map((p: Body) => p.phase)).to.deep.equal(['architecture', 'health']);
    const arch = done.phases[0];
    expect(arch.metrics.layers).to.deep.equal({ from: 'request', count: 3, violations: 1 });
    // api may import db now; it still may not import core (src/uses.ts)
    expect(arch.findings.filter((f: Body) => f.rule === 'layer-violation').map((f: Body) => f.message)).to.deep.equal([
      'src/api/handler.ts (api) imports src/uses.ts (core); api may import db',
    ]);
  });

  it('streams one phase_done per phase, then the report; a client that reconnects with Last-Event-ID resumes that audit', async () => {
    const first = watch(`${h.url}/api/v1/autonomy/workspace-audit/stream?phases=security,sanity,health`);
    // a phase runs the workspace's tools in the sandbox: on a loaded 2-core machine the first can take over 10 s
    await eventually(() => first.events.length >= 1 || first.failed(), 'the first phase', 60_000);
    first.es.close();
    expect(first.failed()).to.equal(null);
    const seen = first.events[0]!;
    expect(seen.name).to.equal('phase_done');
    const reportId = seen.data.data.report_id as string;
    expect(seen.id).to.match(new RegExp(`^${reportId}/\\d+-\\d+$`));
    expect(seen.data.data).to.have.all.keys('report_id', 'phase', 'status', 'counts', 'score', 'duration_ms');

    const resumed = watch(`${h.url}/api/v1/autonomy/workspace-audit/stream?phases=security,sanity,health`, { lastEventId: seen.id });
    await eventually(() => resumed.events.some((e) => e.name === 'report') || resumed.failed(), 'the report', 60_000);
    expect(resumed.failed()).to.equal(null);
    // the rest of that audit, nothing twice: the phases not seen yet, then the report
    const names = [seen, ...resumed.events].map((e) => (e.name === 'report' ? 'report' : e.data.data.phase));
    expect(names.slice(0, 3)).to.have.members(['security', 'sanity', 'health']);
    expect(names.slice(3)).to.deep.equal(['report']);
    const report = resumed.events.at(-1)!.data.data;
    expect(report.report_id).to.equal(reportId);
    expect(report.status).to.equal('completed');
    // EventSource reconnects after any close: past the report, the answer is 204, which stops it
    const after = await fetch(`${h.url}/api/v1/autonomy/workspace-audit/stream`, {
      headers: { authorization: `Bearer ${KEYS.a}`, 'last-event-id': resumed.events.at(-1)!.id },
    });
    expect(after.status).to.equal(204);
    // a workspace that is not one is named where the stream's request gave it: the query
    const nowhere = await h.call<Body>('GET', '/api/v1/autonomy/workspace-audit/stream?workspace=nowhere');
    expect(nowhere.status).to.equal(400);
    expect(nowhere.body.errors[0].path).to.equal('/query/workspace');
    // the stream's layers are held to the POST's schema, and named where they were given: no audit starts
    const indexed = `${h.config.queuePrefix}:audit-index:{tenant-a}`;
    const before = await h.rt.redis.zcard(indexed);
    const layersOf = (layers: unknown) =>
      h.call<Body>('GET', `/api/v1/autonomy/workspace-audit/stream?phases=sanity&layers=${encodeURIComponent(JSON.stringify(layers))}`);
    for (const [layers, path] of [
      [[], '/query/layers'],
      [[{ name: 'n'.repeat(500), path: '^a', extra: 1 }], '/query/layers/0'],
      [Array.from({ length: 60 }, (_, i) => ({ name: `l${i}`, path: '^a' })), '/query/layers'],
      [{ layers: [{ name: 'a', path: '^a' }] }, '/query/layers'],
      [[{ name: 'a' }], '/query/layers/0'],
      [[{ name: 'a', path: '([' }], '/query/layers'],
    ] as const) {
      const refused = await layersOf(layers);
      expect(refused.status, JSON.stringify(layers).slice(0, 80)).to.equal(400);
      expect(refused.body.errors[0].path, JSON.stringify(layers).slice(0, 80)).to.equal(path);
    }
    // and to the checks every JSON body gets: a lone surrogate, a number past a double
    for (const text of ['[{"name":"\\ud800","path":"^a"}]', '[{"name":"a","path":"^a","n":1e999}]']) {
      const refused = await h.call<Body>('GET', `/api/v1/autonomy/workspace-audit/stream?phases=sanity&layers=${encodeURIComponent(text)}`);
      expect(refused.status, text).to.equal(400);
      expect(refused.body.errors[0].path, text).to.equal('/query/layers');
    }
    expect(await h.rt.redis.zcard(indexed), 'audits started').to.equal(before);
    // no other audit was started by the reconnect
    expect(resumed.events.every((e) => (e.name === 'report' ? e.data.data.report_id : e.data.data.report_id) === reportId)).to.equal(true);
  });

  it('keeps a report a few MB whatever the workspace quotes: long texts cut, a map of licenses bounded, and the stream ending with the head', async () => {
    // a lockfile of 1,000 packages, each with a license of 25,000 characters: a 50 MB report, 126 MB in Redis
    const own = await startHarness({ env: { SERVICE_AUDIT_REGISTRY_URL: 'none' } });
    try {
      const long = 'x'.repeat(25_000);
      const packages: Record<string, unknown> = { '': { name: 'big', version: '1.0.0' } };
      for (let i = 0; i < 1000; i++) packages[`node_modules/p${i}`] = { version: '1.0.0', license: `GPL-${i}-${long}` };
      await fs.writeFile(path.join(own.tenantDir(), 'package.json'), JSON.stringify({ name: 'big', version: '1.0.0' }));
      await fs.writeFile(path.join(own.tenantDir(), 'package-lock.json'), JSON.stringify({ name: 'big', lockfileVersion: 3, packages }));
      const res = await own.call<Body>('POST', '/api/v1/autonomy/workspace-audit/run', { body: { timeout_seconds: 110, phases: ['sanity'] } });
      expect(res.status, own.logs.join('').slice(-2000)).to.equal(200);
      expect(Buffer.byteLength(res.text), 'the report, as JSON').to.be.below(3 * 1024 * 1024);
      const sanity = res.body.phases[0];
      expect(sanity.status, sanity.error).to.equal('completed');
      // every copyleft package is still counted; each message is cut, and says so
      const copyleft = sanity.findings.filter((f: Body) => f.rule === 'license-copyleft');
      expect(copyleft.length + sanity.findings_omitted).to.be.at.least(1000);
      for (const f of copyleft) {
        expect(Buffer.byteLength(f.message)).to.be.below(1100);
        expect(f.message).to.match(/^p\d+@1\.0\.0 is GPL-\d+-x+… \(cut: \d+ more characters\)$/);
      }
      // the licenses: the 100 most used (here all used once), the rest counted in `other`, each name cut
      const licenses = sanity.metrics.licenses as Record<string, number>;
      expect(Object.keys(licenses)).to.have.length(101);
      expect(licenses.other).to.equal(900);
      expect(Object.values(licenses).reduce((n, v) => n + v, 0)).to.equal(1000);
      for (const k of Object.keys(licenses)) expect(Buffer.byteLength(k)).to.be.below(250);
      // the stream's end is the report's head: no findings or metrics, which are fetched with the report
      const [end] = await own.rt.events.newestFirst(scopes.audit(res.body.report_id).stream, '0-0', '+', 1);
      expect(end?.type).to.equal('audit.finished');
      expect(Buffer.byteLength(JSON.stringify(end)), 'the audit.finished event').to.be.below(4096);
      expect(end!.data).to.deep.include({ report_id: res.body.report_id, status: 'completed', totals: res.body.totals, scores: res.body.scores });
      expect((end!.data as Body).phases[0]).to.have.all.keys('phase', 'status', 'counts', 'score', 'duration_ms', 'findings_omitted', 'error');
      // all the report holds in Redis (its hash and its stream)
      const keys = (await scanKeys(own.rt.redis, `${own.config.queuePrefix}:*`)).filter((k) => k.includes(res.body.report_id));
      let bytes = 0;
      for (const k of keys) bytes += Number(await own.rt.redis.call('MEMORY', 'USAGE', k, 'SAMPLES', '0'));
      expect(keys.length).to.be.at.least(2);
      expect(bytes, 'bytes in Redis').to.be.below(4 * 1024 * 1024);
    } finally {
      await own.close();
    }
  });

  it('starts no audit on HEAD, and refuses a Last-Event-ID that no event of a running audit can have', async () => {
    const reports = async () => (await h.rt.redis.zcard(`${h.config.queuePrefix}:audit-index:{tenant-a}`)) as number;
    const before = await reports();
    const head = await fetch(`${h.url}/api/v1/autonomy/workspace-audit/stream?phases=sanity`, {
      method: 'HEAD',
      headers: { authorization: `Bearer ${KEYS.a}` },
    });
    expect(head.status).to.equal(200);
    expect(head.headers.get('content-type')).to.match(/^text\/event-stream/);
    expect(head.headers.get('x-report-id')).to.equal(null);
    expect(await reports(), 'no audit started').to.equal(before);
    // an audit with no event yet: an id from far in the future would take every event to come as seen
    const started = await h.call<Body>('POST', '/api/v1/autonomy/workspace-audit/run', { body: { phases: ['sanity'], timeout_seconds: 0 } });
    expect(started.status, started.text).to.equal(202);
    const ahead = await fetch(`${h.url}/api/v1/autonomy/workspace-audit/stream`, {
      headers: { authorization: `Bearer ${KEYS.a}`, 'last-event-id': `${started.body.report_id}/999999999999999-0` },
      signal: AbortSignal.timeout(5000),
    });
    expect(ahead.status).to.equal(400);
    await eventually(
      async () => (await h.call<Body>('GET', `/api/v1/autonomy/workspace-audit/${started.body.report_id}`)).body.status === 'completed',
      'the audit',
      40_000,
    );
  });

  it('audits the folder the X-Service-Workspace-Root header names: this very checkout', async () => {
    const res = await h.call<Body>('POST', '/api/v1/autonomy/workspace-audit/run', {
      headers: { 'x-service-workspace-root': PROJECT_ROOT },
      body: { timeout_seconds: 120 },
    });
    expect(res.status, res.text).to.equal(200);
    expect(res.body.workspace).to.equal(await fs.realpath(PROJECT_ROOT));
    expect(res.body.status, JSON.stringify(res.body.phases.map((p: Body) => p.error))).to.equal('completed');
    const arch = res.body.phases.find((p: Body) => p.phase === 'architecture');
    expect(arch.metrics.modules).to.be.greaterThan(150);
    expect(rulesOf(res.body, 'architecture')).not.to.include.members(['import-cycle', 'undeclared-package', 'unresolvable-import']);
    expect(res.body.totals.critical).to.equal(0);
    const sanity = res.body.phases.find((p: Body) => p.phase === 'sanity');
    expect(sanity.metrics).to.deep.include({ manifest: 'package.json', lockfile: 'package-lock.json', readme: 'README.md' });
  });

  it('says what the phase could not read (a folder it may not enter), in a repository or not, never a clean scan of what it skipped', async () => {
    const git = (cwd: string, ...args: string[]) => spawnSync('git', ['-c', 'user.email=t@t', '-c', 'user.name=t', ...args], { cwd, encoding: 'utf8' }).status;
    for (const repository of [false, true]) {
      const name = `locked-${repository ? 'repo' : 'plain'}`;
      const dir = path.join(h.tenantDir(), name);
      for (const sub of ['open', 'locked']) {
        await fs.mkdir(path.join(dir, sub), { recursive: true });
        await fs.writeFile(path.join(dir, sub, '.env'), 'PASSWORD=hunter2\n');
      }
      if (repository) {
        expect(git(dir, 'init', '-q')).to.equal(0);
        expect(git(dir, 'add', '-A')).to.equal(0);
        expect(git(dir, 'commit', '-qm', 'all')).to.equal(0);
      }
      // the phases run as nobody in the sandbox: a folder of mode 000 is closed to them
      await fs.chmod(path.join(dir, 'locked'), 0o000);
      try {
        const res = await h.call<Body>('POST', '/api/v1/autonomy/workspace-audit/run', {
          body: { workspace: name, phases: ['security'], timeout_seconds: 60 },
        });
        expect(res.status, res.text).to.equal(200);
        const security = res.body.phases.find((p: Body) => p.phase === 'security');
        const notScanned = security.findings.filter((f: Body) => f.rule === 'file-not-scanned').map((f: Body) => f.file);
        // the folder, once (not again for the file git tracks in it), whether git lists the folder's files or not
        expect(notScanned, `${name}: ${JSON.stringify(security)}`).to.deep.equal(['locked/']);
        expect(security.metrics.files_not_scanned, name).to.equal(1);
        // what could be read is scanned as before
        expect(security.findings.map((f: Body) => f.file)).to.include('open/.env');
      } finally {
        await fs.chmod(path.join(dir, 'locked'), 0o755);
      }
    }
  });

  it('refuses /etc and its look-alikes with a 403 problem, and what is not a folder with a 400; nothing is started', async () => {
    const link = path.join(h.tenantDir(), 'etc-link');
    await fs.symlink('/etc', link);
    try {
      for (const root of ['/etc', '/proc/self/root/etc', link, `${h.tenantDir()}/../../../../../../etc`, '/sys/kernel']) {
        const res = await h.call<Body>('POST', '/api/v1/autonomy/workspace-audit/run', { headers: { 'x-service-workspace-root': root } });
        expect(res.status, `${root}: ${res.text}`).to.equal(403);
        expect(res.body.code).to.equal('path-not-permitted');
      }
      const missing = await h.call<Body>('POST', '/api/v1/autonomy/workspace-audit/run', { headers: { 'x-service-workspace-root': '/no/such/folder' } });
      expect(missing.status).to.equal(400);
      const badLayer = await h.call<Body>('POST', '/api/v1/autonomy/workspace-audit/run', { body: { layers: [{ name: 'x', path: '([' }] } });
      expect(badLayer.status, badLayer.text).to.equal(400);
      expect(badLayer.body.errors[0].path).to.equal('/body/layers');
      const stream = await fetch(`${h.url}/api/v1/autonomy/workspace-audit/stream`, {
        headers: { authorization: `Bearer ${KEYS.a}`, 'x-service-workspace-root': '/etc' },
      });
      expect(stream.status).to.equal(403);
    } finally {
      await fs.rm(link);
    }
  });

  it('runs as the `audit` step of the nightly-audit template, and the run keeps the report id', async () => {
    const a = await h.call<Body>('POST', '/api/v1/automations/templates/instantiate', { body: { template_id: 'nightly-audit' } });
    expect(a.status, a.text).to.equal(201);
    const started = await h.call<Body>('POST', '/api/v1/automations/run', { body: { automation_id: a.body.id } });
    expect(started.status, started.text).to.equal(202);
    const run = await finishedRun(h, started.body.run.id);
    expect(run.status, JSON.stringify(run.error)).to.equal('succeeded');
    const step = run.steps[0];
    expect(step.tool).to.equal('audit');
    expect(step.output.status).to.equal('completed');
    const report = await h.call<Body>('GET', `/api/v1/autonomy/workspace-audit/${step.output.report_id}`);
    expect(report.body.trigger).to.deep.equal({ type: 'run', run_id: run.id, session_id: run.session_id, attempt: 1 });
    expect(report.body.totals).to.deep.equal(step.output.totals);
  });
});

describe('workspace audit reports: expiry, eviction and phases that do not complete', function () {
  this.timeout(60_000);
  let h: Harness;
  before(async () => {
    h = await startHarness({ env: { SERVICE_AUDIT_REPORT_TTL_SECONDS: '2', SERVICE_AUDIT_REPORTS_MAX: '2', SERVICE_AUDIT_REGISTRY_URL: 'none' } });
    await makeFlawedProject(h.tenantDir());
  });
  after(async () => {
    await h.close();
  });

  it('drops the oldest finished report beyond the cap, never a running one, and every report after its TTL: a 404 that says how long reports are kept', async () => {
    // three started one after the other (not waited for): past the cap of 2, but all running, so none goes
    const ids: string[] = [];
    const start = async () => {
      const res = await h.call<Body>('POST', '/api/v1/autonomy/workspace-audit/run', { body: { phases: ['sanity'], timeout_seconds: 0 } });
      expect(res.status, res.text).to.equal(202);
      ids.push(res.body.report_id);
    };
    for (let i = 0; i < 3; i++) await start();
    // each accepted audit reports
    for (const id of ids)
      await eventually(async () => (await h.call<Body>('GET', `/api/v1/autonomy/workspace-audit/${id}`)).body.status === 'completed', `report ${id}`, 40_000);
    // a fourth: the oldest finished ones go down to the cap
    await start();
    for (const id of ids.slice(0, 2)) {
      const evicted = await h.call<Body>('GET', `/api/v1/autonomy/workspace-audit/${id}`);
      expect(evicted.status, id).to.equal(404);
      expect(evicted.body.detail).to.contain('kept for 2 s').and.contain('the last 2 per tenant');
      // its event log, whose last event holds the whole report, goes with it
      expect(await h.rt.redis.exists(`${h.config.queuePrefix}:events:audit:${id}`), `the event log of ${id}`).to.equal(0);
    }
    await eventually(
      async () => (await h.call<Body>('GET', `/api/v1/autonomy/workspace-audit/${ids[3]}`)).body.status === 'completed',
      'the newest report',
      40_000,
    );
    // kept for 2 s; one kept for good never goes
    await eventually(async () => (await h.call('GET', `/api/v1/autonomy/workspace-audit/${ids[3]}`)).status === 404, 'the TTL', 40_000);
  });

  it('makes the report partial, not stuck, when a phase dies: the others complete, the dead one says why', async () => {
    // this harness's phase (its workspace's identity is on the command line), not another test file's
    const st = await fs.stat(h.tenantDir());
    const ours = `phase-main.[jt]s architecture .*"identity":"${st.dev}:${st.ino}"`;
    const state = (pid: number) => /State:\s+(\w)/.exec(spawnSync('cat', [`/proc/${pid}/status`], { encoding: 'utf8' }).stdout)?.[1];
    let res!: { body: Body };
    // the architecture phase's process (in its sandbox) is killed while it runs: stopped first, so a phase
    // that ends on its own in that moment is told apart (then another audit is tried)
    for (let tries = 1; ; tries++) {
      res = await h.call<Body>('POST', '/api/v1/autonomy/workspace-audit/run', { body: { phases: ['sanity', 'architecture'], timeout_seconds: 0 } });
      expect(res.body.location).to.be.a('string');
      const pid = Number(
        await eventually(() => spawnSync('pgrep', ['-f', ours], { encoding: 'utf8' }).stdout.trim().split('\n')[0], 'the phase process', 30_000),
      );
      try {
        process.kill(pid, 'SIGSTOP');
      } catch {
        // gone already
      }
      const stopped = await eventually(() => (['T', 'Z', undefined].includes(state(pid)) ? (state(pid) ?? 'gone') : null), 'the phase to stop');
      if (stopped === 'T') {
        process.kill(pid, 'SIGKILL');
        break;
      }
      expect(tries, 'the architecture phase ended before it could be stopped, three times').to.be.below(3);
      await eventually(async () => (await h.call<Body>('GET', res.body.location)).body.status !== 'running' || null, 'that report', 30_000);
    }
    const report = await eventually(
      async () => {
        const r = await h.call<Body>('GET', res.body.location);
        return r.body.status !== 'running' ? r.body : null;
      },
      'the report',
      30_000,
    );
    expect(report.status).to.equal('partial');
    const [arch, sanity] = report.phases;
    expect(sanity).to.deep.include({ phase: 'sanity', status: 'completed' });
    expect(arch).to.deep.include({ phase: 'architecture', status: 'failed', score: null });
    expect(arch.error).to.contain('the architecture phase failed');
    expect(report.scores).to.deep.include({ architecture: null });
  });

  it('ends the stream of an audit whose report is gone before its end (Redis lost it): no stream is held open for good', async () => {
    const idle = await startHarness({ workers: false });
    try {
      const res = await fetch(`${idle.url}/api/v1/autonomy/workspace-audit/stream?phases=sanity`, {
        headers: { authorization: `Bearer ${KEYS.a}` },
        signal: AbortSignal.timeout(15_000),
      });
      expect(res.status).to.equal(200);
      const reportId = res.headers.get('x-report-id')!;
      // no worker takes its phases: the audit stays running, the stream sends heartbeats
      await new Promise((r) => setTimeout(r, 300));
      for (const key of await scanKeys(idle.rt.redis, `${idle.config.queuePrefix}:audit*`)) await idle.rt.redis.del(key);
      const ended = Date.now();
      await res.text(); // the stream's end (its heartbeat finds the report gone)
      expect(Date.now() - ended).to.be.below(5000);
      expect((await idle.call('GET', `/api/v1/autonomy/workspace-audit/${reportId}`)).status).to.equal(404);
    } finally {
      await idle.close();
    }
  });

  it('ends the stream of a report whose end Redis refused once: the report is sent from the store, and a reconnect gets it, not a 204', async () => {
    const own = await startHarness({ env: { SERVICE_AUDIT_REGISTRY_URL: 'none' } });
    const events = own.rt.events;
    const append = events.append.bind(events);
    let ends = 0;
    events.append = async (scope, event) => {
      if (event.type === 'audit.finished' && !ends++) throw new Error('injected: Redis refused the write');
      return append(scope, event);
    };
    try {
      await makeFlawedProject(own.tenantDir());
      const stream = watch(`${own.url}/api/v1/autonomy/workspace-audit/stream?phases=sanity`);
      // the report job's end failed after the report was stored; the stream's heartbeat finds the end missing
      await eventually(() => stream.events.some((e) => e.name === 'report') || stream.failed(), 'the report', 60_000);
      stream.es.close();
      // refused, then appended once from the stored report
      expect(ends).to.equal(2);
      const [phase, report] = stream.events;
      expect([phase!.name, report!.name]).to.deep.equal(['phase_done', 'report']);
      expect(report!.data.data.status).to.equal('completed');
      // a reader that had only the phase is sent the report; one that had the report is told there is no more
      const from = async (lastEventId: string) =>
        fetch(`${own.url}/api/v1/autonomy/workspace-audit/stream`, { headers: { authorization: `Bearer ${KEYS.a}`, 'last-event-id': lastEventId } });
      const resumed = await from(phase!.id);
      expect(resumed.status).to.equal(200);
      expect(await resumed.text()).to.contain('event: report');
      expect((await from(report!.id)).status).to.equal(204);
    } finally {
      events.append = append;
      await own.close();
    }
  });

  it('finishes a report whose flow was lost: the reconciler assembles it, partial, and the ledger has it', async () => {
    const audits = h.rt.engine.audits;
    const now = Date.now();
    const report_id = newId('aud');
    await audits.reports.create(
      'tenant-a',
      {
        report_id,
        workspace: '.',
        phases_requested: ['security', 'health'],
        started_at: new Date(now).toISOString(),
        finished_at: null,
        status: 'running',
        trigger: { type: 'api', request_id: 'lost' },
        phases: [],
        totals: { critical: 0, high: 0, medium: 0, low: 0, info: 0 },
        scores: {},
        ledger: null,
      },
      { phases: ['security', 'health'], layers: null },
      now,
    );
    expect(await audits.reconcile(0)).to.equal(1);
    const got = await h.call<Body>('GET', `/api/v1/autonomy/workspace-audit/${report_id}`);
    expect(got.body.status).to.equal('partial');
    expect(got.body.phases.map((p: Body) => [p.phase, p.status])).to.deep.equal([
      ['security', 'failed'],
      ['health', 'failed'],
    ]);
    expect(got.body.ledger.seq).to.be.a('number');
    // once finished, it is not repaired again
    expect(await audits.reconcile(0)).to.equal(0);
  });

  it('leaves a report whose phases still wait for a worker past every timeout running, and finishes one whose phase stays active past them', async () => {
    let ahead = 0;
    const idle = await startHarness({ workers: false, runtime: { clock: { now: () => new Date(Date.now() + ahead) } } });
    // (BullMQ closes no connection it was given: this one is closed below, or the file's process never exits)
    const connection = idle.rt.redis.duplicate();
    const worker = new Worker('audits', null, { connection, prefix: idle.config.queuePrefix });
    try {
      const res = await idle.call<Body>('POST', '/api/v1/autonomy/workspace-audit/run', { body: { phases: ['sanity'], timeout_seconds: 0 } });
      expect(res.status, res.text).to.equal(202);
      const id = res.body.report_id as string;
      // two hours on (the timeout is 600 s): its phase waits in line, as in a nightly burst with every worker busy
      ahead = 2 * 3_600_000;
      expect(await idle.rt.engine.audits.reconcile(0)).to.equal(0);
      expect((await idle.call<Body>('GET', `/api/v1/autonomy/workspace-audit/${id}`)).body.status).to.equal('running');
      // taken by a worker that never ends it (hung): past every timeout, the report is finished, partial
      const phase = await worker.getNextJob('hung');
      expect(phase?.id).to.equal(`${id}__sanity`);
      expect(await idle.rt.engine.audits.reconcile(0)).to.equal(1);
      const got = await idle.call<Body>('GET', `/api/v1/autonomy/workspace-audit/${id}`);
      expect(got.body.status).to.equal('partial');
      expect(got.body.phases.map((p: Body) => [p.phase, p.status])).to.deep.equal([['sanity', 'failed']]);
    } finally {
      await worker.close(true);
      connection.disconnect();
      await idle.close();
    }
  });

  it('finishes a report whose report job ran again while a dead worker still held the assembly (the job completed, the report was left running)', async () => {
    const started = await h.call<Body>('POST', '/api/v1/autonomy/workspace-audit/run', { body: { phases: ['sanity'], timeout_seconds: 0 } });
    const id = started.body.report_id as string;
    // the assembly's claim, as a worker that died assembling left it (it lapses: taken away below)
    await h.rt.redis.set(`${h.config.queuePrefix}:audit:assemble:${id}`, '1');
    const job = await h.rt.queues.get('audits').getJob(`${id}__report`);
    await eventually(async () => (await job!.getState()) === 'completed', 'the redelivered report job to end', 20_000);
    expect((await h.call<Body>('GET', `/api/v1/autonomy/workspace-audit/${id}`)).body.status).to.equal('running');
    await h.rt.redis.del(`${h.config.queuePrefix}:audit:assemble:${id}`);
    // the reconciler finds the report its completed job left running, and assembles it (not half an hour later)
    await h.rt.engine.audits.reconcile(0);
    const got = await h.call<Body>('GET', `/api/v1/autonomy/workspace-audit/${id}`);
    expect(got.body.status).to.equal('completed');
    expect(got.body.ledger.seq).to.be.a('number');
  });
});
