// The built command-line tool (dist/cli/main.js, as `npx automation-service` runs it) as a child process
// against a real service: exit codes by run status, output in order, a web restart mid-run that neither
// loses nor repeats a line, a wrong key, Ctrl-C that cancels, and --json that parses. Also: the built
// entry points import production dependencies only; and, against stub servers, a stream that goes silent,
// Ctrl-C twice at a terminal, usage errors that need no service, redirects it does not follow, and a client
// command that loads none of the service's modules.
import { spawn } from 'node:child_process';
import fs from 'node:fs';
import http from 'node:http';
import type { AddressInfo } from 'node:net';
import { builtinModules } from 'node:module';
import os from 'node:os';
import path from 'node:path';
import { expect } from 'chai';
import { startWebServer, type WebServer } from '../../api/server.js';
import { PROJECT_ROOT } from '../../config/paths.js';
import { signerOf } from '../../engine/evidence/index.js';
import { builtCli, CLI } from '../support/built.js';
import { eventually, KEYS, startHarness, type Harness } from '../support/harness.js';

type Result = { code: number | null; stdout: string; stderr: string };
type Child = { done: Promise<Result>; stdout: () => string; signal(s: NodeJS.Signals): void };

/** The built tool as a child process, with only PATH and `env` in its environment, and `input` (else nothing) on stdin. */
const spawnCli = (args: string[], env: Record<string, string>, input?: string): Child => {
  const child = spawn(process.execPath, [CLI, ...args], {
    env: { PATH: process.env.PATH ?? '', ...env },
    stdio: [input === undefined ? 'ignore' : 'pipe', 'pipe', 'pipe'],
  });
  child.stdin?.end(input);
  let stdout = '';
  let stderr = '';
  child.stdout!.on('data', (d) => (stdout += d));
  child.stderr!.on('data', (d) => (stderr += d));
  const done = new Promise<Result>((resolve) => child.on('close', (code) => resolve({ code, stdout, stderr })));
  return { done, stdout: () => stdout, signal: (s) => child.kill(s) };
};

describe('the command-line tool (built) against a service', function () {
  this.timeout(60_000);
  let h: Harness;
  let restarted: WebServer | undefined;

  before(async () => {
    builtCli();
    h = await startHarness();
  });
  after(async () => {
    await restarted?.close();
    await h?.close();
  });

  const cli = (args: string[], env: Record<string, string> = {}): Child => spawnCli(args, { SERVICE_URL: h.url, SERVICE_API_KEY: KEYS.a, ...env });

  it('a passing run exits 0 with its steps and output in order; a failing one 1; a budget overrun 3', async () => {
    const [ok, failed, over] = await Promise.all([
      cli(['run', '--step', 'shell:for i in 1 2 3 4 5; do echo line-$i; done', '--step', 'shell:echo after', '--wait']).done,
      cli(['run', '--step', 'shell:echo before; exit 7', '--wait']).done,
      cli(['run', '--step', 'shell:sleep 20', '--budget', '1', '--wait']).done,
    ]);
    expect(ok.code, ok.stderr).to.equal(0);
    const lines = ok.stdout.split('\n');
    const order = [
      /^> step 1 shell: for i/,
      /^line-1$/,
      /^line-2$/,
      /^line-3$/,
      /^line-4$/,
      /^line-5$/,
      /^ok step 1 succeeded/,
      /^> step 2 shell: echo after$/,
      /^after$/,
      /^ok step 2 succeeded/,
      /^run run_\w+ succeeded in/,
    ];
    let at = -1;
    for (const line of order) {
      const next = lines.findIndex((l, i) => i > at && line.test(l));
      expect(next, `${line} after line ${at} of:\n${ok.stdout}`).to.be.above(at);
      at = next;
    }
    expect(failed.code, failed.stdout).to.equal(1);
    expect(failed.stdout)
      .to.contain('before')
      .and.contain('exit code 7')
      .and.match(/run run_\w+ failed in/);
    expect(over.code, over.stdout).to.equal(3);
    expect(over.stdout)
      .to.match(/timed_out in/)
      .and.contain('budget-exceeded');
  });

  it('follows a run across a restart of the web process without losing or repeating a line', async () => {
    const port = Number(new URL(h.url).port);
    const child = cli(['run', '--step', 'shell:for i in $(seq 1 40); do echo n-$i; sleep 0.05; done', '--wait']);
    await eventually(() => child.stdout().includes('n-5\n'), 'the first lines', 15_000);
    await h.web.close();
    await new Promise((r) => setTimeout(r, 600));
    restarted = await startWebServer(h.rt, { port, host: '127.0.0.1', validateResponses: true });
    const { code, stdout, stderr } = await child.done;
    expect(code, stdout + stderr).to.equal(0);
    expect(stderr).to.contain('reconnecting');
    const lines = stdout.split('\n').filter((l) => /^n-\d+$/.test(l));
    expect(lines).to.deep.equal(Array.from({ length: 40 }, (_, i) => `n-${i + 1}`));
  });

  it('Ctrl-C with --cancel-on-interrupt cancels the run and exits 4; runs cancel from elsewhere ends a watcher with 4 too', async () => {
    // Ctrl-C, and a CI that cancels its job with SIGTERM (GitLab, Buildkite): the same
    const [child, terminated] = [0, 1].map(() => cli(['run', '--step', 'shell:echo started; sleep 30', '--wait', '--cancel-on-interrupt']));
    await eventually(() => (child!.stdout().includes('started\n') && terminated!.stdout().includes('started\n')) || null, 'the steps to start', 15_000);
    child!.signal('SIGINT');
    terminated!.signal('SIGTERM');
    const [interrupted, ended] = await Promise.all([child!.done, terminated!.done]);
    expect(interrupted.code, interrupted.stdout + interrupted.stderr).to.equal(4);
    expect(interrupted.stderr).to.contain('canceling run');
    expect(interrupted.stdout).to.match(/canceled in/);
    expect(ended.code, ended.stdout + ended.stderr).to.equal(4);
    expect(ended.stdout).to.match(/canceled in/);

    const started = await cli(['run', '--step', 'shell:sleep 30', '--json']).done;
    const { run_id } = JSON.parse(started.stdout) as { run_id: string };
    const watcher = cli(['runs', 'watch', run_id]);
    await eventually(() => watcher.stdout().includes('> step 1'), 'the watcher to see the step', 15_000);
    expect((await cli(['runs', 'cancel', run_id]).done).code).to.equal(0);
    expect((await watcher.done).code).to.equal(4);
  });

  it('a wrong key exits 2 with one clear line; an unreachable service exits 5; --json prints the API’s JSON', async () => {
    // the refusals that need no run, side by side (each is a process of its own)
    const [denied, away, userinfo, unparsable, pasted] = await Promise.all([
      cli(['runs', 'list'], { SERVICE_API_KEY: 'not-a-key-of-this-service' }).done,
      cli(['runs', 'list', '--url', 'http://127.0.0.1:1']).done,
      cli(['runs', 'list', '--url', 'http://u:hunter2pw@127.0.0.1:1']).done,
      // put together here: written out whole it reads as a committed credential to a secret scanner
      cli(['runs', 'list', '--url', ['https://ci-bot', 'hunter2pw@127.0.0.1:99999'].join(':')]).done,
      cli(['runs', 'list'], { SERVICE_API_KEY: `${KEYS.a}\nsecond-line-secret` }).done,
    ]);
    expect(denied.code).to.equal(2);
    expect(denied.stderr.trim()).to.equal('automation-service: 401 unauthorized: the API key is not valid (unknown, revoked or expired)');
    expect(away.code).to.equal(5);
    expect(away.stderr).to.contain('cannot reach the service at http://127.0.0.1:1');
    // a password in the URL is never printed back
    expect(userinfo.code).to.equal(2);
    expect(userinfo.stderr).to.contain('carries a user name or password').and.not.contain('hunter2pw');
    expect(unparsable.code).to.equal(2);
    expect(unparsable.stderr).to.contain('not a URL').and.not.contain('hunter2pw');
    expect(pasted.code).to.equal(2);
    expect(pasted.stderr).not.to.contain(KEYS.a).and.not.contain('second-line-secret');
    // a service behind a path of a proxy: the API's paths go under it
    const prefixed = http.createServer((req, res) => {
      res.writeHead(200, { 'content-type': 'application/json' }).end(JSON.stringify({ data: [{ id: 'run_x', path: req.url }], next_cursor: null }));
    });
    await new Promise<void>((r) => prefixed.listen(0, '127.0.0.1', r));
    try {
      const under = await cli(['runs', 'list', '--json', '--url', `http://127.0.0.1:${(prefixed.address() as AddressInfo).port}/automation/`]).done;
      expect((JSON.parse(under.stdout) as { data: { path: string }[] }).data[0]!.path).to.match(/^\/automation\/api\/v1\/runs/);
    } finally {
      prefixed.close();
    }
    // a 2xx that is not the service's JSON (a proxy's page) is the service's fault (5), not a failed run (1)
    const proxy = http.createServer((_req, res) => res.writeHead(200, { 'content-type': 'text/html' }).end('<html>login</html>'));
    await new Promise<void>((r) => proxy.listen(0, '127.0.0.1', r));
    try {
      const url = `http://127.0.0.1:${(proxy.address() as AddressInfo).port}`;
      const html = await cli(['run', '--step', 'shell:x', '--url', url]).done;
      expect(html.code, html.stderr).to.equal(5);
      expect(html.stderr.trim().split('\n')).to.have.length(1);
      const odd = await cli(['runs', 'list', '--url', url]).done;
      expect(odd.code, odd.stderr).to.equal(5);
    } finally {
      proxy.close();
    }

    const done = await cli(['run', '--step', 'shell:echo json', '--wait', '--json']).done;
    expect(done.code).to.equal(0);
    const run = JSON.parse(done.stdout) as Record<string, any>;
    expect(run).to.include({ status: 'succeeded', kind: 'autonomy' });
    const list = JSON.parse((await cli(['runs', 'list', '--status', 'succeeded', '--json']).done).stdout) as { data: { id: string }[] };
    expect(list.data.map((r) => r.id)).to.include(run.id);
    const table = (await cli(['runs', 'list', '--limit', '2']).done).stdout.split('\n');
    expect(table[0]).to.match(/^ID +KIND +STATUS +DURATION/);
    const usage = await cli(['run', '--wait']).done;
    expect(usage.code).to.equal(2);
    expect(usage.stderr).to.contain('give --step');
  });

  it('runs watch of a run whose events are gone (kept 7 days, or Redis lost them) exits with the run’s own status at once', async () => {
    const started = await cli(['run', '--step', 'shell:exit 3', '--wait', '--json']).done;
    const run = JSON.parse(started.stdout) as { id: string; session_id: string };
    expect(started.code, started.stderr).to.equal(1);
    await h.rt.redis.del(h.rt.events.key(`session:${run.session_id}`));
    const watcher = cli(['runs', 'watch', run.id]);
    // it had reconnected to the empty stream (a 204: nothing more will come) for two minutes, then exited 5
    const stuck = setTimeout(() => watcher.signal('SIGKILL'), 15_000);
    const watched = await watcher.done;
    clearTimeout(stuck);
    expect(watched.code, watched.stdout + watched.stderr).to.equal(1);
    expect(watched.stdout).to.match(new RegExp(`run ${run.id} failed in`));
    expect(watched.stderr).not.to.contain('reconnecting');
  });

  it('runs watch of a session task’s run follows it to its end without dropping at another task’s end', async () => {
    const session = (await h.call('POST', '/api/v1/sessions', { body: { title: 'two tasks' } })).body;
    await h.call('POST', `/api/v1/sessions/${session.id}/tasks`, {
      body: {
        tasks: [
          { id: 'quick', steps: [{ tool: 'message', args: { text: 'quick' } }] },
          { id: 'slow', steps: [{ tool: 'shell', args: { command: 'sleep 1; echo slow-done' } }] },
        ],
      },
    });
    const slow = await eventually(async () => {
      const tasks = (await h.call('GET', `/api/v1/sessions/${session.id}/tasks`)).body.data as { id: string; run_ids: string[] }[];
      return tasks.find((t) => t.id === 'slow')?.run_ids[0];
    }, 'the slow task’s run');
    const watched = await cli(['runs', 'watch', slow]).done;
    expect(watched.code, watched.stdout + watched.stderr).to.equal(0);
    expect(watched.stdout)
      .to.contain('slow-done')
      .and.match(new RegExp(`run ${slow} succeeded in`));
    // the run session's stream ends at the first run.finished of any of the session's runs: it had reconnected after each
    expect(watched.stderr).not.to.contain('reconnecting');
  });

  it('derives the Idempotency-Key from the CI job: the same job and request return the first run', async () => {
    const ci = { GITHUB_ACTIONS: 'true', GITHUB_RUN_ID: `${Date.now()}`, GITHUB_RUN_ATTEMPT: '1', GITHUB_JOB: 'test', GITHUB_REPOSITORY: 'acme/api' };
    const args = ['run', '--step', 'shell:true', '--json'];
    const first = JSON.parse((await cli(args, ci).done).stdout) as { run_id: string };
    const again = JSON.parse((await cli(args, ci).done).stdout) as { run_id: string };
    const rerun = JSON.parse((await cli(args, { ...ci, GITHUB_RUN_ATTEMPT: '2' }).done).stdout) as { run_id: string };
    expect(again.run_id).to.equal(first.run_id);
    expect(rerun.run_id).not.to.equal(first.run_id);
  });

  it('the built entry points import production dependencies only', () => {
    const pkg = JSON.parse(fs.readFileSync(path.join(PROJECT_ROOT, 'package.json'), 'utf8')) as { dependencies: Record<string, string> };
    const allowed = new Set([...Object.keys(pkg.dependencies), ...builtinModules]);
    const missing = new Set<string>();
    const walk = (dir: string) => {
      for (const e of fs.readdirSync(dir, { withFileTypes: true })) {
        const file = path.join(dir, e.name);
        if (e.isDirectory()) walk(file);
        else if (e.name.endsWith('.js'))
          for (const m of fs.readFileSync(file, 'utf8').matchAll(/(?:^import [^;]*?from |^import |import\()['"]([^'".][^'"]*)['"]/gm)) {
            const name = m[1]!.startsWith('@') ? m[1]!.split('/').slice(0, 2).join('/') : m[1]!.split('/')[0]!;
            if (!allowed.has(name.replace(/^node:/, ''))) missing.add(`${name} (${path.relative(PROJECT_ROOT, file)})`);
          }
      }
    };
    walk(path.join(PROJECT_ROOT, 'dist'));
    expect([...missing]).to.deep.equal([]);
  });
});

describe('the command-line tool (built) against stub servers', function () {
  this.timeout(30_000);
  before(() => builtCli());
  const servers: http.Server[] = [];
  afterEach(() => {
    for (const s of servers.splice(0)) {
      s.closeAllConnections();
      s.close();
    }
  });
  const stub = async (handler: http.RequestListener): Promise<string> => {
    const server = http.createServer(handler);
    servers.push(server);
    await new Promise<void>((r) => server.listen(0, '127.0.0.1', r));
    return `http://127.0.0.1:${(server.address() as AddressInfo).port}`;
  };
  const sse = (res: http.ServerResponse) => res.writeHead(200, { 'content-type': 'text/event-stream' }).flushHeaders();
  const json = (res: http.ServerResponse, status: number, body: unknown) =>
    res.writeHead(status, { 'content-type': 'application/json' }).end(JSON.stringify(body));
  const event = (id: number, type: string, data: Record<string, unknown>) =>
    `id: ${id}\nevent: ${type}\ndata: ${JSON.stringify({ id: String(id), type, run_id: 'run_x', data })}\n\n`;

  it('--wait reconnects with Last-Event-ID when the stream goes silent, or a reconnect gets no answer, for --idle-timeout', async () => {
    // a service that froze after one event (or a connection that died without a word), then one that
    // takes the next connection and never answers it, then the service back
    const resumedFrom: (string | undefined)[] = [];
    let streams = 0;
    const url = await stub((req, res) => {
      if (req.method === 'POST') return json(res, 202, { run_id: 'run_x', session_id: 'ses_x', status: 'queued' });
      streams++;
      resumedFrom.push(req.headers['last-event-id'] as string | undefined);
      if (streams === 1) {
        sse(res);
        res.write(event(1, 'run.started', { attempt: 1, queued_ms: 0 }));
      } else if (streams === 3) {
        sse(res);
        res.end(event(2, 'run.finished', { status: 'succeeded', duration_ms: 5 }));
      }
    });
    const child = spawnCli(['run', '--step', 'shell:true', '--wait', '--idle-timeout', '1', '--url', url], {});
    // without a deadline the first silence lasts as long as the kernel keeps the connection: minutes
    const stuck = setTimeout(() => child.signal('SIGKILL'), 15_000);
    const { code, stdout, stderr } = await child.done;
    clearTimeout(stuck);
    expect(code, stdout + stderr).to.equal(0);
    expect(stdout)
      .to.match(/run run_x started/)
      .and.match(/run run_x succeeded/);
    expect(stderr.match(/event stream dropped: the service sent nothing for 1 s; reconnecting/g)).to.have.length(2);
    expect(resumedFrom).to.deep.equal([undefined, '1', '1']);
  });

  it('--wait waits out a 429 on the event stream for its Retry-After and goes on; a 429 elsewhere exits 5, not 2', async () => {
    let streams = 0;
    const url = await stub((req, res) => {
      if (req.method === 'POST') return json(res, 202, { run_id: 'run_x', session_id: 'ses_x', status: 'queued' });
      if (req.url?.startsWith('/api/v1/runs')) {
        res.setHeader('retry-after', '1');
        return json(res, 429, { title: 'Too Many Requests', status: 429, code: 'rate-limited', detail: 'over the tenant’s requests a minute' });
      }
      if (++streams === 1) {
        res.setHeader('retry-after', '1');
        return json(res, 429, { title: 'Too Many Requests', status: 429, code: 'rate-limited', detail: 'over the tenant’s requests a minute' });
      }
      sse(res);
      res.end(event(1, 'run.finished', { status: 'succeeded', duration_ms: 5 }));
    });
    const [waited, listed] = await Promise.all([
      spawnCli(['run', '--step', 'shell:true', '--wait', '--url', url], {}).done,
      spawnCli(['runs', 'list', '--url', url], {}).done,
    ]);
    // it had exited 2, "usage or auth error", at the first 429 while it followed the run
    expect(waited.code, waited.stdout + waited.stderr).to.equal(0);
    expect(waited.stdout).to.match(/run run_x succeeded/);
    expect(streams).to.equal(2);
    expect(listed.code, listed.stderr).to.equal(5);
    expect(listed.stderr).to.contain('429 rate-limited');
  });

  it('--wait exits 5 at once when the event stream is answered by a page that is not one (a proxy’s sign-in): it reconnected four times a second, for good', async () => {
    let streams = 0;
    const url = await stub((req, res) => {
      if (req.method === 'POST') return json(res, 202, { run_id: 'run_x', session_id: 'ses_x', status: 'queued' });
      streams++;
      res.writeHead(200, { 'content-type': 'text/html' }).end('<html>please sign in</html>');
    });
    const { code, stderr } = await spawnCli(['run', '--step', 'shell:true', '--wait', '--url', url], {}).done;
    expect(code, stderr).to.equal(5);
    expect(stderr).to.contain('answered 200 with "text/html", not an event stream');
    expect(streams).to.equal(1);
  });

  it('reads an empty Retry-After as none: a 400 that carries one exits 2, not 5', async () => {
    const url = await stub((_req, res) => {
      res.setHeader('retry-after', '');
      json(res, 400, { title: 'Bad Request', status: 400, code: 'bad-request', detail: 'no' });
    });
    const { code, stderr } = await spawnCli(['runs', 'list', '--url', url], {}).done;
    expect(code, stderr).to.equal(2);
  });

  it('exits 5 on a 409 that says when to retry (the same Idempotency-Key still being handled), 2 on one that does not', async () => {
    const url = await stub((req, res) => {
      if (req.method === 'POST' && req.url === '/api/v1/autonomy/run') {
        res.setHeader('retry-after', '1');
        return json(res, 409, { title: 'Conflict', status: 409, code: 'conflict', detail: 'a request with this Idempotency-Key is still being handled' });
      }
      return json(res, 409, { title: 'Conflict', status: 409, code: 'conflict', detail: 'run run_x is succeeded already' });
    });
    const [inUse, finished] = await Promise.all([
      spawnCli(['run', '--step', 'shell:true', '--idempotency-key', 'k', '--url', url], {}).done,
      spawnCli(['runs', 'cancel', 'run_x', '--url', url], {}).done,
    ]);
    expect(inUse.code, inUse.stderr).to.equal(5);
    expect(inUse.stderr).to.contain('409 conflict');
    expect(finished.code, finished.stderr).to.equal(2);
  });

  /** the audit API as the service answers it: timeout_seconds over 300 is a 400; a 202 carries the phases ended so far (none) */
  const auditService = (reportAfterGets: number | null) => {
    const seen = { waits: [] as unknown[], gets: 0 };
    const running = { report_id: 'aud_x', status: 'running', location: '/api/v1/autonomy/workspace-audit/aud_x', stream: '/s', phases: [] };
    const done = {
      report_id: 'aud_x',
      status: 'completed',
      phases: [{ phase: 'security', status: 'completed', counts: { critical: 0, high: 1, medium: 0, low: 0, info: 0 }, duration_ms: 5 }],
    };
    const url = stub((req, res) => {
      let text = '';
      req.on('data', (d) => (text += d));
      req.on('end', () => {
        if (req.method === 'POST') {
          const wait = (JSON.parse(text) as { timeout_seconds?: number }).timeout_seconds;
          seen.waits.push(wait);
          if (typeof wait === 'number' && wait > 300)
            return json(res, 400, {
              title: 'Bad Request',
              status: 400,
              code: 'validation-failed',
              errors: [{ path: '/body/timeout_seconds', message: 'must be <= 300' }],
            });
          return json(res, 202, running);
        }
        seen.gets++;
        if (req.url !== '/api/v1/autonomy/workspace-audit/aud_x') return json(res, 404, { title: 'Not Found', status: 404 });
        return json(res, 200, reportAfterGets !== null && seen.gets >= reportAfterGets ? done : running);
      });
    });
    return { url, seen };
  };

  it('audit run exits 3 and names the report when the audit is not done within --timeout, with --fail-on too', async () => {
    const { url, seen } = auditService(null);
    const [plain, failOn] = await Promise.all([
      spawnCli(['audit', 'run', '--timeout', '1', '--url', await url], {}).done,
      spawnCli(['audit', 'run', '--timeout', '1', '--fail-on', 'low', '--url', await url], {}).done,
    ]);
    for (const r of [plain, failOn]) {
      expect(r.code, r.stdout + r.stderr).to.equal(3);
      expect(r.stdout).to.contain('audit aud_x still running after 1 s');
    }
    expect(seen.waits).to.deep.equal([1, 1]);
  });

  it('audit run --timeout 600 asks the service to wait at most 300 s, then follows the report for the rest', async () => {
    const { url, seen } = auditService(2);
    const r = await spawnCli(['audit', 'run', '--timeout', '600', '--fail-on', 'high', '--url', await url], {}).done;
    // the help's own example was a 400 (exit 2): the API waits at most 300 s
    expect(r.code, r.stdout + r.stderr).to.equal(1);
    expect(seen.waits).to.deep.equal([300]);
    expect(seen.gets).to.equal(2);
    expect(r.stdout).to.match(/^security\s+completed\s+\{"critical":0,"high":1/);
  });

  it('ends with its own exit code when its reader goes away (`| head`): no stack trace, no 1', async () => {
    // a page of runs whose JSON is far more than a pipe holds
    const runs = Array.from({ length: 100 }, (_, i) => ({ id: `run_${i}`, status: 'succeeded', summary: 'x'.repeat(10_000) }));
    const url = await stub((_req, res) => json(res, 200, { data: runs, next_cursor: null }));
    const child = spawn(process.execPath, [CLI, 'runs', 'list', '--json', '--url', url], {
      env: { PATH: process.env.PATH ?? '' },
      stdio: ['ignore', 'pipe', 'pipe'],
    });
    // the reader leaves before the tool writes: its every write meets a closed pipe (EPIPE)
    child.stdout.destroy();
    let stderr = '';
    child.stderr.on('data', (d) => (stderr += d));
    const code = await new Promise((resolve) => child.on('close', resolve));
    expect(stderr).to.not.contain('EPIPE');
    expect(code, stderr).to.equal(0);
  });

  // a window title, the screen erased, the cursor moved up a line and to its start, an 8-bit CSI, and a line of ours faked
  const EVIL = '\u001b]0;pwned\u0007\u001b[2J\u001b[1A\r\u009b31m\nautomation-service: all good';
  /** What a terminal would obey, less the colour sequences (ESC[...m) a step's output keeps. */
  const obeyed = (text: string) => text.replace(/\u001b\[[0-9;]*m/g, '').match(/[\u0000-\u0009\u000b-\u001f\u007f-\u009f]/g) ?? [];

  it("--wait shows the server's text of every event as escapes and a step's output with its colours only", async () => {
    const url = await stub((req, res) => {
      if (req.method === 'POST') return json(res, 202, { run_id: 'run_x', session_id: 'ses_x', status: 'queued' });
      sse(res);
      res.end(
        [
          event(1, 'run.started', { attempt: 1, queued_ms: 0 }),
          event(2, 'step.started', { index: 0, tool: `shell${EVIL}`, args: { command: `echo${EVIL}` } }),
          event(3, 'step.output', {
            stream: 'stdout',
            text: `\u001b[31mred\u001b[0m plain\u001b]8;;https://evil.example\u001b\\ link\u001b]8;;\u001b\\\u001b[2K\u001b[3A\n`,
          }),
          event(4, 'message.created', { role: 'assistant', text: `said${EVIL}\nsecond line` }),
          event(5, 'run.interrupted', { attempt: 1, reason: `reason${EVIL}`, next_attempt: 2 }),
          event(6, 'step.finished', { index: 0, status: 'failed', duration_ms: 1, error: { message: `step error${EVIL}` } }),
          event(7, 'run.finished', { status: 'failed', duration_ms: 5, summary: `summary${EVIL}`, error: { code: `code${EVIL}`, message: `message${EVIL}` } }),
        ].join(''),
      );
    });
    const { code, stdout, stderr } = await spawnCli(['run', '--step', 'shell:true', '--wait', '--url', url], {}).done;
    expect(code, stdout + stderr).to.equal(1);
    expect(obeyed(stdout), stdout).to.deep.equal([]);
    expect(stdout).to.contain('\u001b[31mred\u001b[0m plain link\n');
    for (const text of ['shell', 'echo', 'said', 'reason', 'step error', 'summary', 'code', 'message'])
      expect(stdout).to.contain(`${text}\\u001b]0;pwned\\u0007\\u001b[2J\\u001b[1A\\u000d\\u009b31m`);
    // a message's own lines stay lines, indented: none reads as one of ours
    expect(stdout).to.contain('\n  automation-service: all good\n  second line\n');
    expect(stdout.split('\n').filter((l) => l.startsWith('automation-service'))).to.deep.equal([]);
  });

  it("shows the server's text as escapes in a run, a page's cursor, an audit's phases and an error; and a pack's in gates verify", async () => {
    const url = await stub((req, res) => {
      if (req.url === '/api/v1/runs/run_x')
        return json(res, 200, {
          id: 'run_x',
          session_id: `ses${EVIL}`,
          kind: 'autonomy',
          status: 'failed',
          summary: `summary${EVIL}`,
          error: { code: 'c', message: `message${EVIL}` },
          steps: [{ tool: `tool${EVIL}`, status: 'failed' }],
        });
      if (req.url === '/api/v1/runs') return json(res, 200, { data: [], next_cursor: `cursor${EVIL}` });
      if (req.url === '/api/v1/autonomy/workspace-audit/run')
        return json(res, 200, { report_id: 'aud_x', status: 'completed', phases: [{ phase: `phase${EVIL}`, status: 'failed', counts: {}, duration_ms: 1 }] });
      json(res, 400, { title: `title${EVIL}`, detail: `detail${EVIL}`, errors: [{ path: `/path${EVIL}`, message: `wrong${EVIL}` }] });
    });
    const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'cli-evil-'));
    try {
      // JSON.parse's error quotes the file's bytes
      const pack = path.join(dir, 'pack.json');
      fs.writeFileSync(pack, `{"a": ${EVIL}`);
      const [get, list, audit, refused, verify] = await Promise.all([
        spawnCli(['runs', 'get', 'run_x', '--url', url], {}).done,
        spawnCli(['runs', 'list', '--url', url], {}).done,
        spawnCli(['audit', 'run', '--url', url], {}).done,
        spawnCli(['automations', 'get', 'aut_x', '--url', url], {}).done,
        spawnCli(['gates', 'verify', pack], {}).done,
      ]);
      for (const [r, code, texts] of [
        [get, 0, ['ses', 'summary', 'message', 'tool']],
        [list, 0, ['cursor']],
        [audit, 1, ['phase']],
        [refused, 2, ['title', 'detail', '/path', 'wrong']],
        [verify, 1, ['"a": ']],
      ] as const) {
        expect(r.code, r.stdout + r.stderr).to.equal(code);
        expect(obeyed(r.stdout + r.stderr), r.stdout + r.stderr).to.deep.equal([]);
        for (const text of texts) expect(r.stdout + r.stderr, text).to.contain(`${text}\\u001b]0;pwned\\u0007`);
        expect(
          (r.stdout + r.stderr).split('\n').filter((l) => l.startsWith('automation-service: all good')),
          r.stdout + r.stderr,
        ).to.deep.equal([]);
      }
    } finally {
      fs.rmSync(dir, { recursive: true, force: true });
    }
  });

  it('prints no value given with a mistyped option (exit 2): a mistyped --key reaches the CI log without its key', async () => {
    const [mistyped, short] = await Promise.all([
      spawnCli(['runs', 'list', '--kye=sk_live_SECRET123', '--url', 'http://127.0.0.1:1'], {}).done,
      spawnCli(['runs', 'list', '-ksk_live_SECRET123', '--url', 'http://127.0.0.1:1'], {}).done,
    ]);
    for (const r of [mistyped, short]) {
      expect(r.code, r.stderr).to.equal(2);
      expect(r.stdout + r.stderr)
        .to.contain('unknown option')
        .and.not.contain('SECRET123');
    }
  });

  it('takes no option for the value of --key, --url, --idempotency-key, --workspace or --cursor (exit 2, nothing sent); one dash is a value', async () => {
    let requests = 0;
    const url = await stub((_req, res) => {
      requests++;
      json(res, 200, { data: [], next_cursor: null });
    });
    // an unset, unquoted $KEY: `--key $KEY --json`
    const taken = await Promise.all(
      [
        ['runs', 'get', 'run_x', '--key', '--json', '--url', url],
        ['runs', 'list', '--url', '--key=sk_live_SECRET123'],
        ['run', '--step', 'shell:true', '--idempotency-key', '--wait', '--url', url],
        ['run', '--step', 'shell:true', '--workspace', '--wait', '--url', url],
        ['runs', 'list', '--cursor', '--json', '--url', url],
      ].map((args) => spawnCli(args, {}).done),
    );
    for (const r of taken) {
      expect(r.code, r.stderr).to.equal(2);
      expect(r.stderr).to.match(/needs a value, and the next word is the option --\w+/);
      expect(r.stderr).not.to.contain('SECRET123');
    }
    expect(requests).to.equal(0);
    // one dash is a value
    const dash = await spawnCli(['runs', 'list', '--key=-abc', '--url', url], {}).done;
    expect(dash.code, dash.stderr).to.equal(0);
    expect(requests).to.equal(1);
  });

  it('keys list and revoke refuse a store that does not exist, and make none; every keys command names the store on stderr', async () => {
    const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'cli-keys-'));
    try {
      // run outside the service's folder: no SERVICE_DATA_DIR, so ./data of where it runs
      const inDir = (args: string[], env: Record<string, string> = {}) => {
        const child = spawn(process.execPath, [CLI, ...args], { cwd: dir, env: { PATH: process.env.PATH ?? '', ...env }, stdio: ['ignore', 'pipe', 'pipe'] });
        let stdout = '';
        let stderr = '';
        child.stdout.on('data', (d) => (stdout += d));
        child.stderr.on('data', (d) => (stderr += d));
        return new Promise<Result>((resolve) => child.on('close', (code) => resolve({ code, stdout, stderr })));
      };
      const file = path.join(fs.realpathSync(dir), 'data', 'service.sqlite');
      for (const args of [
        ['keys', 'list', '--tenant', 'acme'],
        ['keys', 'revoke', 'key_01x', '--tenant', 'acme'],
      ]) {
        const r = await inDir(args);
        expect(r.code, r.stdout + r.stderr).to.equal(2);
        expect(r.stdout).not.to.contain('(none)');
        expect(r.stderr).to.contain(`no key store at ${file}`).and.contain('SERVICE_DATA_DIR');
        expect(fs.existsSync(path.join(dir, 'data')), args.join(' ')).to.equal(false);
      }
      const created = await inDir(['keys', 'create', '--tenant', 'acme']);
      expect(created.code, created.stderr).to.equal(0);
      expect(created.stderr).to.contain(`in a new SQLite store ${file}`);
      const listed = await inDir(['keys', 'list', '--tenant', 'acme']);
      expect(listed.code, listed.stderr).to.equal(0);
      expect(listed.stderr).to.contain(`keys of tenant acme in SQLite store ${file}`);
      expect(listed.stdout).to.match(/^ID\s+LABEL/);
    } finally {
      fs.rmSync(dir, { recursive: true, force: true });
    }
  });

  it('gates run --record refuses a store that does not exist or an evidence key it would make, before any gate runs', async () => {
    const dir = fs.realpathSync(fs.mkdtempSync(path.join(os.tmpdir(), 'cli-record-')));
    try {
      const data = path.join(dir, 'data');
      const ws = path.join(dir, 'workspaces', 'acme');
      fs.mkdirSync(ws, { recursive: true });
      fs.writeFileSync(path.join(ws, 'gates.yaml'), 'gates:\n  - id: ok\n    run: [/bin/true]\n');
      const env = { SERVICE_DATA_DIR: data, SERVICE_WORKSPACE_ROOT: path.join(dir, 'workspaces'), LOG_LEVEL: 'silent' };
      const record = () => spawnCli(['gates', 'run', '--workspace', ws, '--record', '--tenant', 'acme'], env).done;
      // a wrong SERVICE_DATA_DIR: no store there
      const noStore = await record();
      expect(noStore.code, noStore.stdout + noStore.stderr).to.equal(2);
      expect(noStore.stderr)
        .to.contain(`--record: no store at ${path.join(data, 'service.sqlite')}`)
        .and.contain('SERVICE_DATA_DIR');
      expect(noStore.stdout).not.to.contain('gates of');
      expect(fs.existsSync(data)).to.equal(false);
      // a store, but no evidence key: one made here would sign a ledger no one pins
      const made = await spawnCli(['keys', 'create', '--tenant', 'acme'], env).done;
      expect(made.code, made.stderr).to.equal(0);
      const noKey = await record();
      expect(noKey.code, noKey.stdout + noKey.stderr).to.equal(2);
      expect(noKey.stderr).to.contain('--record: no evidence key: set SERVICE_EVIDENCE_KEY');
      expect(fs.existsSync(path.join(data, 'evidence.key'))).to.equal(false);
      // the service's key: recorded
      const recorded = await spawnCli(['gates', 'run', '--workspace', ws, '--record', '--tenant', 'acme'], {
        ...env,
        SERVICE_EVIDENCE_KEY: 'a'.repeat(64),
      }).done;
      expect(recorded.code, recorded.stdout + recorded.stderr).to.equal(0);
      expect(recorded.stdout).to.match(/recorded as grn_\w+: ledger entries/);
      // a key that is not the one the ledger was signed with (a shell's key from before a rotation, a typo): refused
      // before any gate runs; signed in, its entries broke every pack of the commit for good
      const [keyA, keyB] = ['a'.repeat(64), 'b'.repeat(64)];
      const withKey = (key: string, previous?: string) =>
        spawnCli(['gates', 'run', '--workspace', ws, '--record', '--tenant', 'acme'], {
          ...env,
          SERVICE_EVIDENCE_KEY: key,
          ...(previous ? { SERVICE_EVIDENCE_PREVIOUS_KEYS: previous } : {}),
        }).done;
      const idOf = (hex: string) => signerOf(Buffer.from(hex, 'hex')).keyId;
      const wrong = await withKey(keyB);
      expect(wrong.code, wrong.stdout + wrong.stderr).to.equal(2);
      expect(wrong.stderr)
        .to.contain(`signed by key ${idOf(keyA)}; this key is ${idOf(keyB)}`)
        .and.contain('SERVICE_EVIDENCE_PREVIOUS_KEYS');
      expect(wrong.stdout).not.to.contain('gates of');
      // B told A is the key it took over from (a rotation): recorded; A after it is refused
      const pemLine = (hex: string) => signerOf(Buffer.from(hex, 'hex')).publicKeyPem.split('\n')[1]!;
      const rotated = await withKey(keyB, pemLine(keyA));
      expect(rotated.code, rotated.stdout + rotated.stderr).to.equal(0);
      const back = await withKey(keyA);
      expect(back.code, back.stdout + back.stderr).to.equal(2);
      expect(back.stderr).to.contain(`signed by key ${idOf(keyB)}`);
    } finally {
      fs.rmSync(dir, { recursive: true, force: true });
    }
  });

  it('gives up on a call the service does not answer after --request-timeout (exit 5), headers or body', async () => {
    // one stub answers nothing at all; the other sends its headers and then nothing of the body
    const silent = await stub(() => {});
    const halfway = await stub((_req, res) => void res.writeHead(200, { 'content-type': 'application/json' }).write('{"id":'));
    const started = Date.now();
    const results = await Promise.all([silent, halfway].map((url) => spawnCli(['runs', 'get', 'run_x', '--request-timeout', '1', '--url', url], {}).done));
    for (const r of results) {
      expect(r.code, r.stderr).to.equal(5);
      expect(r.stderr).to.contain('did not answer GET /api/v1/runs/run_x within 1 s');
    }
    expect(Date.now() - started).to.be.below(10_000);
  });

  it('a second Ctrl-C at the cancel prompt leaves the run going and exits 130', async () => {
    let cancels = 0;
    const url = await stub((req, res) => {
      if (req.url === '/api/v1/runs/run_x/cancel') {
        cancels++;
        return json(res, 202, { id: 'run_x', status: 'canceled' });
      }
      if (req.url === '/api/v1/runs/run_x') return json(res, 200, { id: 'run_x', session_id: 'ses_x', kind: 'autonomy', status: 'running' });
      sse(res);
      res.write(event(1, 'run.started', { attempt: 1, queued_ms: 0 }));
      const heartbeat = setInterval(() => res.write(': heartbeat\n\n'), 200);
      req.on('close', () => clearInterval(heartbeat));
    });
    // `script` gives the tool a pseudo-terminal: Ctrl-C is a SIGINT, then a key its prompt reads. The shell
    // between them outlives the first Ctrl-C (its trap) to print the tool's own exit code
    const cmd = `trap : INT; ${[process.execPath, CLI, 'runs', 'watch', 'run_x', '--url', url].map((a) => `'${a}'`).join(' ')}; echo "exit code $?"`;
    const child = spawn('script', ['-qfec', cmd, '/dev/null'], { env: { PATH: process.env.PATH ?? '' }, stdio: ['pipe', 'pipe', 'inherit'] });
    let screen = '';
    child.stdout.on('data', (d) => (screen += d));
    const closed = new Promise<number | null>((resolve) => child.on('close', resolve));
    await eventually(() => screen.includes('run run_x started') || null, 'the run to be followed', 10_000);
    child.stdin.write('\x03');
    await eventually(() => screen.includes('cancel run run_x? [y/N]') || null, 'the prompt', 10_000);
    child.stdin.write('\x03');
    const stuck = setTimeout(() => child.kill('SIGKILL'), 10_000);
    await closed;
    clearTimeout(stuck);
    expect(screen).to.contain('exit code 130');
    expect(screen).to.contain('left run run_x running').and.not.contain('AbortError');
    expect(cancels).to.equal(0);
  });

  it('follows no redirect: a 307 or 301 exits 5 naming the Location, and nothing reaches the address it names', async () => {
    // fetch followed them: the secret (307/308: the run's steps too) went to the other address, and its answer
    // was printed as the service's ("codehost: 1 secret set", its run id) with exit 0
    const received: string[] = [];
    const elsewhere = await stub((req, res) => {
      received.push(`${req.method} ${req.url}`);
      req.resume();
      json(res, 200, { run_id: 'run_elsewhere', session_id: 'ses_x', status: 'queued', kind: 'codehost', secrets: 1 });
    });
    const moved = (status: number, acceptRun = false) =>
      stub((req, res) => {
        if (acceptRun && req.method === 'POST') return json(res, 202, { run_id: 'run_x', session_id: 'ses_x', status: 'queued' });
        res.writeHead(status, { location: `${elsewhere}${req.url}` }).end();
      });
    const secret = (url: string, env: Record<string, string> = {}) => spawnCli(['secrets', 'set', 'codehost', '--url', url], env, 'whsec_TOPSECRET\n').done;
    const run = (url: string, ...more: string[]) => {
      const child = spawnCli(['run', '--step', 'shell:true', ...more, '--url', url], {});
      // --wait had taken the redirected stream's end for a dropped connection and reconnected for two minutes
      const stuck = setTimeout(() => child.signal('SIGKILL'), 15_000);
      return child.done.finally(() => clearTimeout(stuck));
    };
    const [temporary, permanent, following] = await Promise.all([moved(307), moved(301), moved(307, true)]);
    // a redirect within the service's origin would carry the API key with the request
    const sameOrigin = await stub((req, res) => {
      if (req.url?.startsWith('/moved/')) {
        received.push(`${req.method} ${req.url} (same origin, key ${req.headers.authorization ?? 'none'})`);
        return json(res, 200, { kind: 'codehost', secrets: 1 });
      }
      res.writeHead(308, { location: `/moved${req.url}` }).end();
    });
    const results = await Promise.all([
      secret(temporary).then((r) => ({ ...r, status: 307, path: '/api/v1/webhook-secrets/codehost', to: elsewhere })),
      secret(permanent).then((r) => ({ ...r, status: 301, path: '/api/v1/webhook-secrets/codehost', to: elsewhere })),
      run(temporary).then((r) => ({ ...r, status: 307, path: '/api/v1/autonomy/run', to: elsewhere })),
      run(permanent).then((r) => ({ ...r, status: 301, path: '/api/v1/autonomy/run', to: elsewhere })),
      // the run started; its event stream redirects: not retried for two minutes as a dropped connection
      run(following, '--wait').then((r) => ({ ...r, status: 307, path: '/api/v1/autonomy/streaming/ses_x/events', to: elsewhere })),
      secret(sameOrigin, { SERVICE_API_KEY: 'svc_same_origin_key' }).then((r) => ({
        ...r,
        status: 308,
        path: '/api/v1/webhook-secrets/codehost',
        to: `${sameOrigin}/moved`,
      })),
    ]);
    for (const r of results) {
      expect(r.code, r.stdout + r.stderr).to.equal(5);
      expect(r.stderr.trim().split('\n').pop(), r.stderr).to.match(/^automation-service: the service at http:\/\/127\.0\.0\.1:\d+\/api\/v1\//);
      expect(r.stderr).to.contain(`answered ${r.status}, a redirect to ${r.to}${r.path}`).and.contain(`set --url or SERVICE_URL to ${r.to}\n`);
      expect(r.stdout).not.to.contain('secret set').and.not.contain('run_elsewhere');
      expect(r.stderr).not.to.contain('reconnecting').and.not.contain('TOPSECRET');
    }
    expect(received).to.deep.equal([]);
  });

  it('refuses a --url that is not http(s) and a bad --input as usage errors (2)', async () => {
    const [ftp, input] = await Promise.all([
      spawnCli(['runs', 'list', '--url', 'ftp://127.0.0.1:1'], {}).done,
      spawnCli(['automations', 'run', 'aut_x', '--input', 'noequals', '--url', 'http://127.0.0.1:1'], {}).done,
    ]);
    expect(ftp.code, ftp.stderr).to.equal(2);
    expect(ftp.stderr).to.contain('must start with http:// or https://');
    expect(input.code, input.stderr).to.equal(2);
    expect(input.stderr).to.contain('--input takes name=value, got "noequals"');
    // a wait no timer can hold (it fired at once: every call timed out), and a tenant no key can have
    const [long, tenant] = await Promise.all([
      spawnCli(['runs', 'list', '--request-timeout', '2147484', '--url', 'http://127.0.0.1:1'], {}).done,
      spawnCli(['gates', 'run', '--workspace', '.', '--record', '--tenant', 'acme/app/..'], {}).done,
    ]);
    expect(long.code, long.stderr).to.equal(2);
    expect(long.stderr).to.contain('--request-timeout must be a whole number from 1 to 2147483');
    expect(tenant.code, tenant.stderr).to.equal(2);
    expect(tenant.stderr).to.contain('--tenant: letters, digits, _ or -');
  });

  it('gates run --json prints one JSON document on stdout, its log lines on stderr, whatever the CLI was handed open', async () => {
    const ws = fs.mkdtempSync(path.join(os.tmpdir(), 'cli-gates-'));
    fs.writeFileSync(path.join(ws, 'gates.yaml'), 'gates:\n  - id: ok\n    run: [/bin/true]\n');
    // a descriptor beyond stdio, as make's jobserver or a CI runner's pipe: the sandbox closes it, and says so in a log line
    const extra = fs.openSync(path.join(ws, 'gates.yaml'), 'r');
    try {
      const child = spawn(process.execPath, [CLI, 'gates', 'run', '--workspace', ws, '--json'], {
        env: { PATH: process.env.PATH ?? '' },
        stdio: ['ignore', 'pipe', 'pipe', ...Array.from({ length: 97 }, (_, i) => (i === 96 ? extra : ('ignore' as const)))],
      });
      let stdout = '';
      let stderr = '';
      child.stdout!.on('data', (d) => (stdout += d));
      child.stderr!.on('data', (d) => (stderr += d));
      const code = await new Promise((resolve) => child.on('close', resolve));
      expect(code, stderr).to.equal(0);
      expect(JSON.parse(stdout)).to.deep.include({ ready: true });
      expect(stderr).to.contain('closed descriptors inherited open');
    } finally {
      fs.closeSync(extra);
      fs.rmSync(ws, { recursive: true, force: true });
    }
  });

  it('loads none of the service’s own modules for --help or a client command; `keys` loads its store when it runs', async () => {
    // what a command loaded, from the CommonJS module cache at exit: the Redis client, the queue, the
    // stores' drivers and the logger are CommonJS packages, and a client command loads none of them
    const dir = fs.mkdtempSync(path.join(os.tmpdir(), 'cli-loads-'));
    try {
      const probe = path.join(dir, 'probe.cjs');
      fs.writeFileSync(probe, `process.on('exit', () => require('fs').writeFileSync(process.env.LOADED_TO, Object.keys(require.cache).join('\\n')));`);
      const loaded = async (args: string[], env: Record<string, string> = {}) => {
        const to = path.join(dir, `loaded-${args[0]}`);
        const child = spawn(process.execPath, ['--require', probe, CLI, ...args], {
          env: { PATH: process.env.PATH ?? '', LOADED_TO: to, ...env },
          stdio: ['ignore', 'ignore', 'pipe'],
        });
        await new Promise((resolve) => child.on('close', resolve));
        const packages = fs
          .readFileSync(to, 'utf8')
          .split('\n')
          .map((f) => /node_modules\/((?:@[^/]+\/)?[^/]+)\//.exec(f)?.[1])
          .filter(Boolean);
        return new Set(packages);
      };
      const heavy = ['ioredis', 'bullmq', 'better-sqlite3', 'mongoose', 'pino'];
      for (const args of [['--help'], ['runs', 'list', '--url', 'http://127.0.0.1:1']]) {
        const packages = await loaded(args);
        expect(packages.has('commander'), args.join(' ')).to.equal(true);
        expect(
          heavy.filter((p) => packages.has(p)),
          args.join(' '),
        ).to.deep.equal([]);
      }
      const keys = await loaded(['keys', 'create', '--tenant', 'acme'], { SERVICE_DATA_DIR: path.join(dir, 'data') });
      expect(['better-sqlite3', 'pino'].filter((p) => keys.has(p))).to.deep.equal(['better-sqlite3', 'pino']);
    } finally {
      fs.rmSync(dir, { recursive: true, force: true });
    }
  });
});
