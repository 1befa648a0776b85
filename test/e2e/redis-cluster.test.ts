// The service on a Redis Cluster: three masters started by this test (redis-server with cluster mode on
// loopback ports, joined by redis-cli --cluster create). REDIS_URL lists the nodes and the queue prefix
// carries a hash tag, so BullMQ's scripts and ours keep their keys in one slot. A run end to end with
// its stream, a verified webhook processed by the workers, a task DAG (its Lua state) and a gate-style
// flow (an audit) all work; a prefix without a hash tag, or one URL to a cluster node, is refused.
import { execFileSync, spawn, type ChildProcess } from 'node:child_process';
import fs from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import { expect } from 'chai';
import { Cluster } from 'ioredis';
import { ConfigError, parseEnv } from '../../config/env.js';
import { eventually, finishedRun, freePort, listening, refusalToOpen, startHarness, type Harness, uniquePrefix } from '../support/harness.js';
import * as sign from '../support/signers.js';

type Body = Record<string, any>;

describe('on a Redis Cluster', function () {
  this.timeout(120_000);
  const servers: ChildProcess[] = [];
  let dir: string;
  let ports: number[];
  let url: string;
  let prefix: string;
  let h: Harness;

  before(async () => {
    dir = await fs.mkdtemp(path.join(os.tmpdir(), 'redis-cluster-'));
    ports = [await freePort([10000]), await freePort([10000]), await freePort([10000])];
    for (const port of ports)
      servers.push(
        spawn(
          'redis-server',
          [
            '--port',
            String(port),
            '--bind',
            '127.0.0.1',
            '--cluster-enabled',
            'yes',
            '--cluster-config-file',
            `nodes-${port}.conf`,
            '--dir',
            dir,
            '--save',
            '',
            '--appendonly',
            'no',
          ],
          { stdio: 'ignore' },
        ),
      );
    for (const port of ports) await eventually(() => listening(port), `redis-server on ${port}`);
    execFileSync('redis-cli', ['--cluster', 'create', ...ports.map((p) => `127.0.0.1:${p}`), '--cluster-replicas', '0', '--cluster-yes'], { stdio: 'ignore' });
    for (const port of ports)
      await eventually(
        () => execFileSync('redis-cli', ['-p', String(port), 'cluster', 'info'], { encoding: 'utf8' }).includes('cluster_state:ok'),
        'the cluster',
      );
    url = `redis://${ports.map((p) => `127.0.0.1:${p}`).join(',')}`;
    prefix = `{${uniquePrefix()}}`;
    h = await startHarness({ env: { REDIS_URL: url, SERVICE_QUEUE_PREFIX: prefix, SERVICE_RECONCILE_INTERVAL_SECONDS: '2' } });
  });
  after(async () => {
    await h?.close();
    for (const s of servers) s.kill('SIGKILL');
    await fs.rm(dir, { recursive: true, force: true });
  });

  it('runs a run end to end, its events streamed, with every key of the service in one slot', async () => {
    const started = await h.call<Body>('POST', '/api/v1/autonomy/run', { body: { steps: [{ tool: 'shell', args: { command: 'echo on-a-cluster' } }] } });
    expect(started.status, started.text).to.equal(202);
    const run = await finishedRun(h, started.body.run_id);
    expect(run.status).to.equal('succeeded');
    const events = await h.call('GET', `/api/v1/autonomy/streaming/${run.session_id}/events`);
    expect(events.text).to.contain('event: run.finished').and.contain('on-a-cluster');
    // the keys are where the hash tag puts them: one slot, on one master
    const cluster = new Cluster(ports.slice(0, 1).map((port) => ({ host: '127.0.0.1', port })));
    await new Promise((resolve) => cluster.once('ready', resolve));
    try {
      const slots = new Set<number>();
      for (const node of cluster.nodes('master')) {
        let cursor = '0';
        do {
          const [next, keys] = await node.scan(cursor, 'MATCH', `${prefix}:*`, 'COUNT', 500);
          cursor = next;
          for (const k of keys) slots.add((await node.cluster('KEYSLOT', k)) as number);
        } while (cursor !== '0');
      }
      expect(cluster.nodes('master')).to.have.length(3);
      expect(slots.size).to.equal(1);
    } finally {
      cluster.disconnect();
    }
  });

  it('takes a signed webhook and processes it in the workers', async () => {
    expect((await h.call('PUT', '/api/v1/webhook-secrets/codehost', { body: { secrets: ['cluster-secret-0123456789'] } })).status).to.equal(200);
    const push = await sign.codehost('cluster-secret-0123456789', { ref: 'refs/heads/main', repository: { full_name: 'acme/app' } });
    const res = await fetch(`${h.url}/webhooks/tenant-a/codehost`, { method: 'POST', headers: push.headers, body: push.body });
    expect(res.status).to.equal(200);
    const { delivery_id } = (await res.json()) as Body;
    await eventually(async () => (await h.call<Body>('GET', `/api/v1/webhook-deliveries/${delivery_id}`)).body.status === 'processed', 'the delivery');
  });

  it('runs a task DAG and an audit flow', async () => {
    const created = await h.call<Body>('POST', '/api/v1/sessions', { body: { title: 'cluster DAG' } });
    expect(created.status, created.text).to.equal(201);
    const id = created.body.id;
    const step = (t: string) => [{ tool: 'message', args: { text: t } }];
    const added = await h.call<Body>('POST', `/api/v1/sessions/${id}/tasks`, {
      body: {
        tasks: [
          { id: 'a', steps: step('a') },
          { id: 'b', depends_on: ['a'], steps: step('b') },
          { id: 'c', depends_on: ['a', 'b'], steps: step('c') },
        ],
      },
    });
    expect(added.status, added.text).to.equal(201);
    const session = await eventually(async () => {
      const s = (await h.call<Body>('GET', `/api/v1/sessions/${id}`)).body;
      return s.outcome ? s : null;
    }, 'the session');
    expect(session.outcome).to.equal('succeeded');
    const audit = await h.call<Body>('POST', '/api/v1/autonomy/workspace-audit/run', { body: { phases: ['sanity', 'health'], timeout_seconds: 60 } });
    expect(audit.status, audit.text).to.equal(200);
    expect(audit.body.status).to.equal('completed');
  });

  it('refuses a queue prefix without a hash tag, and one URL that reaches a cluster node', async () => {
    expect(() => parseEnv({ REDIS_URL: url, SERVICE_QUEUE_PREFIX: 'svc' })).to.throw(ConfigError, /hash tag/);
    const dataDir = await fs.mkdtemp(path.join(os.tmpdir(), 'redis-cluster-one-'));
    try {
      const config = parseEnv({
        REDIS_URL: `redis://127.0.0.1:${ports[0]}`,
        SERVICE_QUEUE_PREFIX: 'svc',
        SERVICE_DATA_DIR: dataDir,
        SERVICE_WORKSPACE_ROOT: path.join(dataDir, 'ws'),
      });
      const err = await refusalToOpen(config);
      expect(err).to.be.instanceOf(ConfigError);
      expect((err as Error).message).to.contain('node of a Redis Cluster');
    } finally {
      await fs.rm(dataDir, { recursive: true, force: true });
    }
  });
});
