// The templates act where their users work: each built-in template, instantiated, fed a signed webhook
// from its provider, ends in the action on that provider (fake providers on loopback, each reached
// through its SDK). The agent's turns are scripted; what the templates themselves do is not.
import { execFileSync } from 'node:child_process';
import fs from 'node:fs';
import path from 'node:path';
import { expect } from 'chai';
import { FAKE_TOKEN, makePullRequestRepo, startFakeProviders, type FakeProviders } from '../support/fake-providers.js';
import { eventually, finishedRun, startHarness, type Harness } from '../support/harness.js';
import { startScriptedModel, type ScriptedModel, type ScriptedTurn } from '../support/scripted-model.js';
import * as sign from '../support/signers.js';

// eslint-disable-next-line @typescript-eslint/no-explicit-any
type Body = Record<string, any>;

const SECRET = 'webhook-secret-0123456789abcdef';

describe('templates that act on their providers', function () {
  this.timeout(60_000);
  let h: Harness;
  let fake: FakeProviders;
  let model: ScriptedModel;
  /** the agent's turns, taken in order by the runs below (each test waits for its run) */
  const script: ScriptedTurn[] = [];

  before(async () => {
    fake = await startFakeProviders();
    model = await startScriptedModel(script);
    h = await startHarness({
      env: { SERVICE_HTTP_ALLOW_PRIVATE: '1', SERVICE_SANDBOX_ALLOW_NETWORK: '1', SERVICE_AGENT_BASE_URL: model.url, SERVICE_AGENT_MODEL: 'scripted-1' },
    });
    const add = async (body: Body) => expect((await h.call('POST', '/api/v1/connections', { body })).status).to.equal(201);
    await add({ provider: 'codehost', name: 'github', base_url: fake.github, credential: FAKE_TOKEN });
    await add({ provider: 'chat', name: 'slack', base_url: fake.slack, credential: FAKE_TOKEN });
    await add({ provider: 'tracker', name: 'linear', base_url: fake.linear, credential: FAKE_TOKEN });
    await add({ provider: 'pager', name: 'pagerduty', base_url: fake.pager, credential: FAKE_TOKEN, settings: { from: 'oncall@acme.test' } });
    for (const kind of ['codehost', 'chat', 'tracker', 'pager'])
      expect((await h.call('PUT', `/api/v1/webhook-secrets/${kind}`, { body: { secrets: [SECRET] } })).status).to.equal(200);
  });
  after(async () => {
    await h?.close();
    await fake?.close();
    await model?.close();
  });

  async function instantiate(template_id: string, variables: Body): Promise<string> {
    const res = await h.call<Body>('POST', '/api/v1/automations/templates/instantiate', { body: { template_id, variables } });
    expect(res.status, res.text).to.equal(201);
    return res.body.id;
  }

  async function deliver(kind: string, signed: sign.Signed): Promise<void> {
    const res = await fetch(`${h.url}/webhooks/tenant-a/${kind}`, { method: 'POST', headers: signed.headers, body: signed.body });
    expect(res.status, await res.text()).to.be.oneOf([200, 202]);
  }

  /** the one run an automation's delivery started, finished */
  async function onlyRun(automationId: string): Promise<Body> {
    const id = await eventually(
      async () => (await h.call<Body>('GET', `/api/v1/automations/${automationId}/history`)).body.data[0]?.id,
      'the run to start',
      // a checkout and a clone start it: seconds on a loaded machine
      45_000,
    );
    return finishedRun(h, id);
  }

  it('pr-review: a signed pull_request checks out the head and ends in a review with line comments on the pull request', async () => {
    const repo = makePullRequestRepo(h.config.dataDir, 12, { path: 'src/pay.ts', content: 'export const total = (a: number, b: number) => a - b;\n' });
    fake.serveRepo('acme/shop', repo.bare);
    script.push(
      {
        tool_calls: [
          {
            name: 'codehost',
            args: {
              action: 'review',
              repository: 'acme/shop',
              number: 12,
              commit_id: repo.head,
              event: 'REQUEST_CHANGES',
              body: 'total subtracts.',
              comments: [{ path: 'src/pay.ts', line: 1, body: 'This should be a + b.' }],
            },
          },
        ],
      },
      { content: 'Reviewed: one defect.' },
    );
    const automation = await instantiate('pr-review', { repository: 'acme/shop', test_command: 'true' });
    // the tenant put a link where the service keeps its checkouts: the service makes its own folder there
    const elsewhere = fs.mkdtempSync(path.join(h.config.dataDir, 'elsewhere-'));
    fs.rmSync(path.join(h.tenantDir(), '.checkouts'), { recursive: true, force: true });
    fs.symlinkSync(elsewhere, path.join(h.tenantDir(), '.checkouts'));
    const event = {
      action: 'opened',
      number: 12,
      pull_request: { number: 12, title: 'Add totals', head: { sha: repo.head, ref: 'totals' } },
      repository: { full_name: 'acme/shop' },
    };
    await deliver('codehost', await sign.codehost(SECRET, event, { event: 'pull_request' }));
    const run = await onlyRun(automation);
    expect(run.status, JSON.stringify(run.error)).to.equal('succeeded');
    expect(run.steps[0]).to.deep.include({ tool: 'codehost', status: 'succeeded' });
    expect(run.steps[0].output.head_sha).to.equal(repo.head);
    // the agent was told what was checked out, and read the pull request's own files
    const prompt = JSON.stringify(model.requests.at(-2)!.body.messages);
    expect(prompt).to.contain('#12 of acme/shop').and.contain(repo.head);
    // the checkout was the run's own folder, gone with the run; the tenant's root has none of it
    expect(fs.existsSync(path.join(h.tenantDir(), '.checkouts', run.id))).to.equal(false);
    expect(fs.lstatSync(path.join(h.tenantDir(), '.checkouts')).isDirectory(), 'the link replaced by a folder').to.equal(true);
    expect(fs.readdirSync(elsewhere), 'nothing made where the link pointed').to.deep.equal([]);
    expect(fs.existsSync(path.join(h.tenantDir(), 'src/pay.ts'))).to.equal(false);
    const review = fake.requests.find((r) => r.path === '/github/repos/acme/shop/pulls/12/reviews')!;
    expect(review.body).to.deep.include({ event: 'REQUEST_CHANGES', commit_id: repo.head });
    expect(review.body.comments).to.deep.equal([{ path: 'src/pay.ts', line: 1, side: 'RIGHT', body: 'This should be a + b.' }]);
  });

  it('gates-on-push: a signed push checks out the commit and reports one check run per gate, with the right conclusions and annotations', async () => {
    const root = path.join(h.config.dataDir, 'push');
    fs.mkdirSync(root);
    const gates = [
      'version: 1',
      'gates:',
      '  - id: lint',
      '    run: [sh, -c, "exit 0"]',
      '  - id: types',
      '    run: [sh, -c, "echo \'src/pay.ts(1,40): error TS2322: Type string is not assignable to type number.\'; exit 2"]',
      '    report: { format: tsc }',
      '',
    ].join('\n');
    const repo = makePullRequestRepo(root, 1, { path: 'gates.yaml', content: gates });
    // the push: main moves to the commit with the gates
    execFileSync('git', ['update-ref', 'refs/heads/main', repo.head], { cwd: repo.bare });
    execFileSync('git', ['update-server-info'], { cwd: repo.bare });
    fake.serveRepo('acme/api', repo.bare);
    const automation = await instantiate('gates-on-push', { repository: 'acme/api', branch: 'main' });
    // a push to another branch runs nothing
    await deliver(
      'codehost',
      await sign.codehost(SECRET, { ref: 'refs/heads/feature', after: repo.head, repository: { full_name: 'acme/api' } }, { event: 'push' }),
    );
    const other = await onlyRun(automation);
    expect(other.steps.map((s: Body) => s.status)).to.deep.equal(['skipped', 'skipped', 'skipped']);
    expect(fake.requests.filter((r) => r.path === '/github/repos/acme/api/check-runs')).to.deep.equal([]);
    await deliver(
      'codehost',
      await sign.codehost(SECRET, { ref: 'refs/heads/main', after: repo.head, repository: { full_name: 'acme/api' } }, { event: 'push' }),
    );
    const runId = await eventually(async () => {
      const runs = (await h.call<Body>('GET', `/api/v1/automations/${automation}/history`)).body.data;
      return runs.length === 2 ? runs[0].id : null;
    }, 'the second run');
    const run = await finishedRun(h, runId);
    expect(run.steps.map((s: Body) => `${s.tool}:${s.status}`)).to.deep.equal(['codehost:succeeded', 'gates:failed', 'message:skipped']);
    expect(run.error.code).to.equal('gates-failed');
    const checks = fake.requests.filter((r) => r.path === '/github/repos/acme/api/check-runs').map((r) => r.body);
    expect(checks.map((c) => [c.name, c.conclusion, c.head_sha])).to.deep.equal([
      ['gate: lint', 'success', repo.head],
      ['gate: types', 'failure', repo.head],
    ]);
    expect(checks[1].output.annotations[0]).to.deep.include({ path: 'src/pay.ts', start_line: 1, annotation_level: 'failure' });
    expect(run.steps[1].output.check_runs.map((c: Body) => c.gate_id)).to.deep.equal(['lint', 'types']);
  });

  it('chat-command: a signed mention ends in the agent’s answer posted in the mention’s thread', async () => {
    script.push({ content: 'The retry policy is in engine/runs/retry.ts.' });
    const automation = await instantiate('chat-command', {});
    const body = JSON.stringify({
      type: 'event_callback',
      event_id: 'Ev1',
      event: { type: 'app_mention', channel: 'C9', ts: '1700000001.000200', text: '<@U1> where is the retry policy?' },
    });
    await deliver('chat', sign.chat(SECRET, body));
    const run = await onlyRun(automation);
    expect(run.status, JSON.stringify(run.error)).to.equal('succeeded');
    const posted = fake.requests.filter((r) => r.path === '/slack/api/chat.postMessage').at(-1)!;
    expect(posted.body).to.deep.include({ channel: 'C9', thread_ts: '1700000001.000200', text: 'The retry policy is in engine/runs/retry.ts.' });
    expect(JSON.stringify(model.requests.at(-1)!.body.messages)).to.contain('where is the retry policy?');
  });

  it('chat-command: answers its own slash command, not another command of the same chat app', async () => {
    script.push({ content: 'Deploys go through the release workflow.' });
    // a command without its slash would name no command chat sends: refused, not made to never fire
    const bare = await h.call<Body>('POST', '/api/v1/automations/templates/instantiate', {
      body: { template_id: 'chat-command', variables: { command: 'ask' } },
    });
    expect(bare.status, bare.text).to.equal(400);
    expect(bare.body.errors[0]).to.deep.include({ path: '/body/variables/command' });
    const automation = await instantiate('chat-command', { command: '/ask' });
    const form = (command: string) =>
      new URLSearchParams({ command, text: 'how do deploys work?', channel_id: 'C7', user_id: 'U2', trigger_id: `t-${command}` }).toString();
    // another command the app serves (its /deploy): no run, and no agent budget spent
    await deliver('chat', sign.chat(SECRET, form('/deploy'), { contentType: 'application/x-www-form-urlencoded' }));
    const other = await eventually(
      async () => (await h.call<Body>('GET', '/api/v1/webhook-deliveries?kind=chat&limit=1')).body.data.find((d: Body) => d.status !== 'received') ?? null,
      'the /deploy delivery to be processed',
    );
    expect(other.runs).to.deep.equal([]);
    // its own: answered in the command's channel
    await deliver('chat', sign.chat(SECRET, form('/ask'), { contentType: 'application/x-www-form-urlencoded' }));
    const run = await onlyRun(automation);
    expect(run.status, JSON.stringify(run.error)).to.equal('succeeded');
    expect(run.trigger).to.deep.include({ type: 'webhook' });
    const posted = fake.requests.filter((r) => r.path === '/slack/api/chat.postMessage').at(-1)!;
    expect(posted.body).to.deep.include({ channel: 'C7', text: 'Deploys go through the release workflow.' });
    expect((await h.call<Body>('GET', `/api/v1/automations/${automation}/history`)).body.data).to.have.length(1);
  });

  it('tracker-issue-triage: a signed issue creation ends in labels, a priority and a comment on the issue', async () => {
    script.push(
      {
        tool_calls: [
          { name: 'tracker', args: { action: 'set_labels', issue_id: 'issue-77', labels: ['bug'] } },
          { name: 'tracker', args: { action: 'set_priority', issue_id: 'issue-77', priority: 2 } },
          { name: 'tracker', args: { action: 'comment', issue_id: 'issue-77', body: 'Owner: payments. The total is wrong.' } },
        ],
      },
      { content: 'Triaged.' },
    );
    const automation = await instantiate('tracker-issue-triage', { team: 'PAY' });
    await deliver(
      'tracker',
      sign.tracker(SECRET, {
        action: 'create',
        type: 'Issue',
        data: { id: 'issue-77', identifier: 'PAY-77', title: 'Totals are wrong', team: { key: 'PAY' } },
      }),
    );
    const run = await onlyRun(automation);
    expect(run.status, JSON.stringify(run.error)).to.equal('succeeded');
    const vars = fake.requests.filter((r) => r.provider === 'linear').map((r) => r.body.variables);
    expect(vars).to.deep.include({ id: 'issue-77', input: { addedLabelIds: ['label-bug'] } });
    expect(vars).to.deep.include({ id: 'issue-77', input: { priority: 2 } });
    expect(vars.some((v) => v.input?.issueId === 'issue-77' && v.input.body.startsWith('Owner: payments'))).to.equal(true);
    expect(JSON.stringify(model.requests.at(-2)!.body.messages))
      .to.contain('PAY-77')
      .and.contain('issue-77');
  });

  it('incident-triage: a signed incident ends in the agent’s triage note on the incident', async () => {
    script.push({ content: 'Failing: checkout. Likely cause: the 10:02 deploy. Next: roll back.' });
    const automation = await instantiate('incident-triage', { service: 'checkout' });
    const incident = { event: { id: 'ev-1', event_type: 'incident.triggered', data: { id: 'PINC1', title: 'Checkout 500s', urgency: 'high' } } };
    await deliver('pager', sign.pager([SECRET], incident));
    const run = await onlyRun(automation);
    expect(run.status, JSON.stringify(run.error)).to.equal('succeeded');
    const note = fake.requests.find((r) => r.path === '/pager/incidents/PINC1/notes')!;
    expect(note.body).to.deep.equal({ note: { content: 'Failing: checkout. Likely cause: the 10:02 deploy. Next: roll back.' } });
    expect(note.headers.from).to.equal('oncall@acme.test');
  });
});
