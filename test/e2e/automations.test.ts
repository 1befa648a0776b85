import { expect } from 'chai';
import { heldTogether, KEYS, startHarness, type Harness } from '../support/harness.js';
import { startWebServer } from '../../api/server.js';

/** An agent endpoint set (never called here): automations whose work is a goal need one. */
const AGENT_ENV = { SERVICE_AGENT_BASE_URL: 'http://127.0.0.1:9/v1', SERVICE_AGENT_MODEL: 'unused', SERVICE_CRON_MIN_INTERVAL_SECONDS: '1' };

const definition = {
  name: 'Nightly tests',
  description: 'Runs the tests every night',
  triggers: [{ type: 'cron', schedule: '0 3 * * *', timezone: 'Europe/Paris' }, { type: 'manual' }],
  tool_allowlist: ['shell', 'message'],
  budget: { seconds: 300, max_steps: 10 },
  steps: [{ tool: 'shell', args: { command: 'npm test' } }],
};

describe('automations API', () => {
  let h: Harness;
  before(async () => {
    h = await startHarness({ env: AGENT_ENV });
  });
  after(async () => {
    await h.close();
  });

  async function create(body: object = definition, key = KEYS.a) {
    const res = await h.call('POST', '/api/v1/automations', { body, key });
    expect(res.status, res.text).to.equal(201);
    return res;
  }

  it('creates from a definition: 201, Location, every field', async () => {
    const res = await create();
    const a = res.body;
    expect(res.headers.get('location')).to.equal(`/api/v1/automations/${a.id}`);
    expect(a.id).to.match(/^aut_[0-9a-z]{26}$/);
    expect(a).to.deep.include({
      tenant_id: 'tenant-a',
      name: 'Nightly tests',
      status: 'enabled',
      goal: null,
      template: null,
      budget: { seconds: 300, max_steps: 10 },
      tool_allowlist: ['shell', 'message'],
    });
    expect(a.triggers).to.deep.equal(definition.triggers);
    expect(a.created_at).to.equal(a.updated_at);
    const got = await h.call('GET', res.headers.get('location')!);
    expect(got.status).to.equal(200);
    expect(got.body).to.deep.equal(a);
  });

  it('fills defaults: a manual trigger, the configured budget, and read-only tools for a goal', async () => {
    const { body } = await create({ name: 'Ask', goal: 'Summarise the README' });
    expect(body.triggers).to.deep.equal([{ type: 'manual' }]);
    expect(body.budget).to.deep.equal({ seconds: h.config.runBudget.defaultSeconds });
    expect(body.tool_allowlist).to.deep.equal(['read_file', 'list_files', 'message']);
    expect(body.steps).to.equal(null);
  });

  it('refuses a goal or an agent step when no agent endpoint is configured (every fire would fail), and stores nothing; and a cron faster than the operator allows', async () => {
    const bare = await startHarness();
    try {
      // SERVICE_CRON_MIN_INTERVAL_SECONDS is 60 unless set: second-level schedules are refused, a template's too
      const steps = [{ tool: 'message', args: { text: 'x' } }];
      for (const [body, gap] of [
        [{ name: 'fast', steps, triggers: [{ type: 'cron', schedule: '* * * * * *', timezone: 'UTC' }] }, 1],
        [{ name: 'halfmin', steps, triggers: [{ type: 'manual' }, { type: 'cron', schedule: '0,30 * * * * *', timezone: 'Europe/Paris' }] }, 30],
      ] as const) {
        const res = await bare.call('POST', '/api/v1/automations', { body });
        expect(res.status, res.text).to.equal(400);
        const error = res.body.errors.find((e: { path: string }) => e.path.endsWith('/schedule'));
        expect(error.message).to.equal(`fires every ${gap} s; the shortest interval allowed is 60 s (SERVICE_CRON_MIN_INTERVAL_SECONDS)`);
      }
      const minutely = await bare.call('POST', '/api/v1/automations', {
        body: { name: 'minutely', steps, triggers: [{ type: 'cron', schedule: '* * * * *', timezone: 'UTC' }] },
      });
      expect(minutely.status, minutely.text).to.equal(201);
      expect(
        (
          await bare.call('PATCH', `/api/v1/automations/${minutely.body.id}`, {
            body: { triggers: [{ type: 'cron', schedule: '*/5 * * * * *', timezone: 'UTC' }] },
          })
        ).status,
      ).to.equal(400);
      const template = await bare.call('POST', '/api/v1/automations/templates/instantiate', {
        body: { template_id: 'weekly-health-report', variables: { schedule: '* * * * * *' } },
      });
      expect(template.status, template.text).to.equal(400);
      expect(template.body.errors.map((e: { message: string }) => e.message)).to.include(
        'fires every 1 s; the shortest interval allowed is 60 s (SERVICE_CRON_MIN_INTERVAL_SECONDS)',
      );
      await bare.call('DELETE', `/api/v1/automations/${minutely.body.id}`);
      for (const body of [
        { name: 'Ask', goal: 'Summarise the README' },
        { name: 'Plan', steps: [{ tool: 'agent', args: { goal: 'plan' } }] },
        { template_id: 'pr-review', variables: { repository: 'acme/api' } },
      ]) {
        const res = await bare.call('POST', '/api/v1/automations', { body });
        expect(res.status, res.text).to.equal(422);
        expect(res.body.code).to.equal('agent-not-configured');
      }
      expect((await bare.call('GET', '/api/v1/automations')).body.data).to.deep.equal([]);
    } finally {
      await bare.close();
    }
  });

  it('keeps a tenant to SERVICE_TENANT_MAX_AUTOMATIONS automations, archived ones aside, from a definition or a template', async () => {
    const small = await startHarness({ workers: false, env: { SERVICE_TENANT_MAX_AUTOMATIONS: '2' } });
    try {
      const make = (key = KEYS.a) =>
        small.call('POST', '/api/v1/automations', { key, body: { name: 'bounded', steps: [{ tool: 'message', args: { text: 'x' } }] } });
      const first = await make();
      expect((await make()).status).to.equal(201);
      const over = await make();
      expect(over.status, over.text).to.equal(409);
      expect(over.body.detail).to.contain('SERVICE_TENANT_MAX_AUTOMATIONS');
      const fromTemplate = await small.call('POST', '/api/v1/automations/templates/instantiate', {
        body: { template_id: 'nightly-audit', variables: {} },
      });
      expect(fromTemplate.status, fromTemplate.text).to.equal(409);
      expect((await small.call('GET', '/api/v1/automations')).body.data).to.have.length(2);
      // another tenant has its own count; an archived automation frees its place
      expect((await make(KEYS.b)).status).to.equal(201);
      expect((await small.call('DELETE', `/api/v1/automations/${first.body.id}`)).status).to.be.oneOf([200, 204]);
      expect((await make()).status).to.equal(201);
    } finally {
      await small.close();
    }
  });

  it('makes a template whose own budget is over a lowered SERVICE_RUN_MAX_BUDGET_SECONDS with the most the deployment allows; a variable over it is still refused', async () => {
    const short = await startHarness({ workers: false, env: { SERVICE_RUN_MAX_BUDGET_SECONDS: '600', SERVICE_RUN_DEFAULT_BUDGET_SECONDS: '300' } });
    try {
      const needs: Record<string, Record<string, string>> = { 'gates-on-push': { repository: 'acme/app' } };
      for (const template_id of ['nightly-audit', 'gates-on-push', 'weekly-health-report']) {
        const made = await short.call('POST', '/api/v1/automations/templates/instantiate', { body: { template_id, variables: needs[template_id] ?? {} } });
        expect(made.status, `${template_id}: ${made.text}`).to.equal(201);
        expect(made.body.budget.seconds, template_id).to.equal(600);
      }
      // the caller's own choice is the caller's to fix: refused, naming where
      const chosen = await short.call('POST', '/api/v1/automations/templates/instantiate', {
        body: { template_id: 'pr-review', variables: { repository: 'acme/app', budget_seconds: 900 } },
      });
      expect(chosen.status, chosen.text).to.equal(400);
    } finally {
      await short.close();
    }
  });

  it('keeps the cap when creates race: of two at once, one below it, one is made and the other refused with 409', async () => {
    const small = await startHarness({ workers: false, env: { SERVICE_TENANT_MAX_AUTOMATIONS: '2' } });
    try {
      const body = { name: 'bounded', steps: [{ tool: 'message', args: { text: 'x' } }] };
      expect((await small.call('POST', '/api/v1/automations', { body })).status).to.equal(201);
      // one from a definition, one from a template, both at the store before either answers: the insert's
      // own count (the only one) refuses one
      const release = heldTogether(small.rt.store.automations, 'insert', 2);
      const raced = await Promise.all([
        small.call('POST', '/api/v1/automations', { body }),
        small.call('POST', '/api/v1/automations/templates/instantiate', { body: { template_id: 'nightly-audit', variables: {} } }),
      ]).finally(release);
      expect(raced.map((r) => r.status).sort(), raced.map((r) => r.text).join('\n')).to.deep.equal([201, 409]);
      const refused = raced.find((r) => r.status === 409)!;
      expect(refused.body).to.deep.include({ code: 'conflict' });
      expect(refused.body.detail).to.contain('SERVICE_TENANT_MAX_AUTOMATIONS');
      expect((await small.call('GET', '/api/v1/automations')).body.data).to.have.length(2);
      expect(await small.rt.store.automations.countLive('tenant-a')).to.equal(2);
    } finally {
      await small.close();
    }
  });

  it('validates triggers of every kind and says which field is wrong', async () => {
    const bad = await h.call('POST', '/api/v1/automations', {
      body: { ...definition, triggers: [{ type: 'cron', schedule: '0 25 * * *', timezone: 'Europe/Atlantis' }] },
    });
    expect(bad.status).to.equal(400);
    expect(bad.headers.get('content-type')).to.contain('application/problem+json');
    expect(bad.body.code).to.equal('validation-failed');
    expect(bad.body.errors.map((e: { path: string }) => e.path)).to.deep.equal(['/body/triggers/0/schedule', '/body/triggers/0/timezone']);

    const provider = await h.call('POST', '/api/v1/automations', { body: { ...definition, triggers: [{ type: 'webhook', provider: 'fax' }] } });
    expect(provider.status).to.equal(400);
    expect(JSON.stringify(provider.body.errors)).to.contain('provider');

    const ok = await create({
      ...definition,
      triggers: [
        { type: 'webhook', provider: 'codehost', events: ['push', 'pull_request.opened'] },
        { type: 'file_change', paths: ['src/**/*.ts'], debounce_ms: 250 },
        { type: 'cron', schedule: '*/30 * * * * *', timezone: 'UTC' },
      ],
    });
    expect(ok.body.triggers).to.have.length(3);

    const outside = await h.call('POST', '/api/v1/automations', { body: { ...definition, triggers: [{ type: 'file_change', paths: ['../../etc/*'] }] } });
    expect(outside.status).to.equal(400);
    expect(outside.body.errors[0].path).to.equal('/body/triggers/0/paths/0');

    // a trigger that is not an object: a 400, on POST and PATCH, and nothing stored
    const before = (await h.call<{ data: unknown[] }>('GET', '/api/v1/automations?limit=100')).body.data.length;
    for (const trigger of ['x', 1, true, [], null]) {
      const posted = await h.call('POST', '/api/v1/automations', { body: { ...definition, triggers: [trigger] } });
      expect(posted.status, JSON.stringify(trigger)).to.equal(400);
      expect(posted.body.errors[0].path).to.equal('/body/triggers/0');
      const patched = await h.call('PATCH', `/api/v1/automations/${ok.body.id}`, { body: { triggers: [trigger] } });
      expect(patched.status, JSON.stringify(trigger)).to.equal(400);
    }
    expect((await h.call<{ data: unknown[] }>('GET', '/api/v1/automations?limit=100')).body.data.length).to.equal(before);
    expect((await h.call('GET', `/api/v1/automations/${ok.body.id}`)).body.triggers).to.have.length(3);
    // one stored before the schema said so (a string among the triggers) breaks no query of the triggers
    const legacy = { ...ok.body, id: 'aut_legacystringtrigger0000000', triggers: ['x', ...ok.body.triggers] };
    await h.rt.store.automations.insert(legacy);
    expect((await h.rt.store.automations.listEnabledWithTrigger('file_change')).map((a) => a.id)).to.include(legacy.id);
    await h.rt.engine.schedules.reconcile();
    await h.call('DELETE', `/api/v1/automations/${legacy.id}`);
  });

  it('refuses file_change globs that can never fire (a folder ending in /, a folder the watcher never looks into) with 400, and stores nothing', async () => {
    const before = (await h.call<{ data: unknown[] }>('GET', '/api/v1/automations?limit=100')).body.data.length;
    // (`!src/gen/` would exclude nothing, and src/gen's files would fire)
    const silent = ['.git/refs/heads/*', 'node_modules/**', 'src/', './.scratch/x.txt', 'pkg/*/.checkouts/**', '{node_modules,.git}/**', '!src/gen/'];
    // a glob of which one of its braces' globs can fire is taken: {src,node_modules}/** fires for src
    const bad = await h.call<{ code: string; errors: { path: string; message: string }[] }>('POST', '/api/v1/automations', {
      body: { ...definition, triggers: [{ type: 'file_change', paths: ['src/**', ...silent, '!node_modules/**', '{src,node_modules}/**', '!{gen/,x/**}'] }] },
    });
    expect(bad.status).to.equal(400);
    expect(bad.headers.get('content-type')).to.contain('application/problem+json');
    expect(bad.body.code).to.equal('validation-failed');
    // each silent glob, named with why; src/** and the ! glob of a folder never watched (harmless) pass
    expect(bad.body.errors.map((e) => e.path)).to.deep.equal(silent.map((_, j) => `/body/triggers/0/paths/${j + 1}`));
    bad.body.errors.forEach((e, j) => expect(e.message).to.contain(`"${silent[j]}"`));
    expect(bad.body.errors[0]!.message).to.match(/\.git is not watched/);
    expect(bad.body.errors[1]!.message).to.match(/node_modules is not watched/);
    expect(bad.body.errors[2]!.message).to.match(/ends in \/.*src\/\*\*/);
    expect(bad.body.errors[6]!.message).to.match(/ends in \/.*!src\/gen\/\*\*/);

    const ok = await create({ ...definition, triggers: [{ type: 'file_change', paths: ['src/**'] }] });
    for (const paths of [['.git/refs/heads/*'], ['node_modules/**'], ['src/']]) {
      const posted = await h.call('POST', '/api/v1/automations', { body: { ...definition, triggers: [{ type: 'file_change', paths }] } });
      expect(posted.status, paths[0]).to.equal(400);
      const patched = await h.call('PATCH', `/api/v1/automations/${ok.body.id}`, { body: { triggers: [{ type: 'file_change', paths }] } });
      expect(patched.status, paths[0]).to.equal(400);
    }
    expect((await h.call<{ data: unknown[] }>('GET', '/api/v1/automations?limit=100')).body.data.length).to.equal(before + 1);
    expect((await h.call('GET', `/api/v1/automations/${ok.body.id}`)).body.triggers).to.deep.equal([
      { type: 'file_change', paths: ['src/**'], debounce_ms: 500 },
    ]);
  });

  it('refuses work that is missing, tools outside the allowlist, and budgets over the maximum', async () => {
    const none = await h.call('POST', '/api/v1/automations', { body: { name: 'nothing to do' } });
    expect(none.status).to.equal(400);
    const tool = await h.call('POST', '/api/v1/automations', { body: { ...definition, tool_allowlist: ['message'] } });
    expect(tool.status).to.equal(400);
    expect(tool.body.errors[0]).to.deep.include({ path: '/body/steps/0/tool' });
    const budget = await h.call('POST', '/api/v1/automations', { body: { ...definition, budget: { seconds: h.config.runBudget.maxSeconds + 1 } } });
    expect(budget.status).to.equal(400);
    expect(budget.body.errors[0].path).to.equal('/body/budget/seconds');
  });

  it('lists the tenant’s own, newest first, with cursor pages and a status filter', async () => {
    const h2 = await startHarness();
    try {
      const ids: string[] = [];
      for (let i = 0; i < 5; i++) ids.push((await h2.call('POST', '/api/v1/automations', { body: { ...definition, name: `n${i}` } })).body.id);
      await h2.call('POST', '/api/v1/automations', { body: { ...definition, name: 'other tenant' }, key: KEYS.b });
      await h2.call('POST', `/api/v1/automations/${ids[1]}/disable`);
      await h2.call('DELETE', `/api/v1/automations/${ids[0]}`);

      const seen: string[] = [];
      let cursor: string | null = null;
      do {
        const page: { body: { data: { name: string }[]; next_cursor: string | null } } = await h2.call(
          'GET',
          `/api/v1/automations?limit=2${cursor ? `&cursor=${cursor}` : ''}`,
        );
        seen.push(...page.body.data.map((a) => a.name));
        cursor = page.body.next_cursor;
      } while (cursor);
      expect(seen).to.deep.equal(['n4', 'n3', 'n2', 'n1']);

      const disabled = await h2.call('GET', '/api/v1/automations?status=disabled');
      expect(disabled.body.data.map((a: { name: string }) => a.name)).to.deep.equal(['n1']);
      const archived = await h2.call('GET', '/api/v1/automations?status=archived');
      expect(archived.body.data.map((a: { name: string }) => a.name)).to.deep.equal(['n0']);
      const both = await h2.call('GET', '/api/v1/automations?status=enabled,disabled&limit=10');
      expect(both.body.data).to.have.length(4);
      const all = await h2.call('GET', '/api/v1/automations?include_archived=true&limit=100');
      expect(all.body.data).to.have.length(5);
      const bad = await h2.call('GET', '/api/v1/automations?limit=500');
      expect(bad.status).to.equal(400);
      const badCursor = await h2.call('GET', '/api/v1/automations?cursor=forged');
      expect(badCursor.status, badCursor.text).to.equal(400);
      expect(badCursor.body.errors[0].path).to.equal('/query/cursor');

      // production answers the stored JSON texts as they are (no response validation): byte for byte
      // the answer the validated path gives, headers and ETag included
      const unchecked = await startWebServer(h2.rt, { port: 0, host: '127.0.0.1' });
      try {
        for (const query of [
          'limit=2',
          `limit=2&cursor=${encodeURIComponent(String((await h2.call('GET', '/api/v1/automations?limit=2')).body.next_cursor))}`,
          'include_archived=true',
        ]) {
          const get = (url: string) => fetch(`${url}/api/v1/automations?${query}`, { headers: { authorization: `Bearer ${KEYS.a}` } });
          const [checked, spliced] = await Promise.all([get(h2.web.url), get(unchecked.url)]);
          const text = await spliced.text();
          expect(text, query).to.equal(await checked.text());
          expect(JSON.parse(text).data.length, query).to.be.greaterThan(0);
          for (const header of ['content-type', 'etag', 'content-length']) expect(spliced.headers.get(header), header).to.equal(checked.headers.get(header));
        }
      } finally {
        await unchecked.close();
      }
    } finally {
      await h2.close();
    }
  });

  it('patches only name, description, triggers, tool_allowlist and budget', async () => {
    const { body: a } = await create();
    const patched = await h.call('PATCH', `/api/v1/automations/${a.id}`, {
      body: { name: 'Renamed', description: null, budget: { seconds: 120 }, triggers: [{ type: 'manual' }] },
    });
    expect(patched.status).to.equal(200);
    expect(patched.body).to.deep.include({ name: 'Renamed', description: null, budget: { seconds: 120, max_steps: 10 } });
    expect(patched.body.updated_at >= a.updated_at).to.equal(true);
    for (const forbidden of [{ status: 'disabled' }, { steps: [] }, { id: 'aut_x' }, { tenant_id: 'tenant-b' }, {}]) {
      const res = await h.call('PATCH', `/api/v1/automations/${a.id}`, { body: forbidden });
      expect(res.status, JSON.stringify(forbidden)).to.equal(400);
    }
    const merge = await h.call('PATCH', `/api/v1/automations/${a.id}`, {
      raw: JSON.stringify({ name: 'Merged' }),
      headers: { 'content-type': 'application/merge-patch+json' },
    });
    expect(merge.status).to.equal(200);
    expect(merge.body.name).to.equal('Merged');
    // RFC 7396: a member left out keeps its value, null removes it
    const seconds = await h.call('PATCH', `/api/v1/automations/${a.id}`, { body: { budget: { seconds: 90 } } });
    expect(seconds.body.budget).to.deep.equal({ seconds: 90, max_steps: 10 });
    const unbounded = await h.call('PATCH', `/api/v1/automations/${a.id}`, {
      raw: JSON.stringify({ budget: { max_steps: null } }),
      headers: { 'content-type': 'application/merge-patch+json' },
    });
    expect(unbounded.status, unbounded.text).to.equal(200);
    expect(unbounded.body.budget).to.deep.equal({ seconds: 90 });
    const unchanged = await h.call('GET', `/api/v1/automations/${a.id}`);
    expect(unchanged.body.status).to.equal('enabled');
    expect(unchanged.body.steps).to.deep.equal(definition.steps);
  });

  it('merges a PATCH of budget and connections members into what is stored: two PATCHes at once both land, null removes a member', async () => {
    const { body: a } = await create({ ...definition, connections: { codehost: 'gh', chat: 'sl' } });
    // both read the automation before either writes (the window a lost update needs, open every time)
    const release = heldTogether(h.rt.store.automations, 'get', 2);
    let answers: Awaited<ReturnType<typeof h.call>>[];
    try {
      answers = await Promise.all([
        h.call('PATCH', `/api/v1/automations/${a.id}`, { body: { budget: { seconds: 200 } } }),
        h.call('PATCH', `/api/v1/automations/${a.id}`, { body: { budget: { max_steps: 20 }, connections: { chat: 'other' } } }),
      ]);
    } finally {
      release();
    }
    expect(answers.map((r) => r.status)).to.deep.equal([200, 200]);
    const stored = (await h.call('GET', `/api/v1/automations/${a.id}`)).body;
    expect(stored.budget).to.deep.equal({ seconds: 200, max_steps: 20 });
    expect(stored.connections).to.deep.equal({ codehost: 'gh', chat: 'other' });
    const removed = await h.call('PATCH', `/api/v1/automations/${a.id}`, {
      raw: JSON.stringify({ connections: { codehost: null } }),
      headers: { 'content-type': 'application/merge-patch+json' },
    });
    expect(removed.status, removed.text).to.equal(200);
    expect(removed.body.connections).to.deep.equal({ chat: 'other' });
    const tooLong = await h.call('PATCH', `/api/v1/automations/${a.id}`, { body: { budget: { seconds: 86_400 } } });
    expect(tooLong.status, 'over SERVICE_RUN_MAX_BUDGET_SECONDS').to.equal(400);
    expect((await h.call('GET', `/api/v1/automations/${a.id}`)).body.budget).to.deep.equal({ seconds: 200, max_steps: 20 });
  });

  it('enables and disables, then archives softly and idempotently; archived cannot change (409)', async () => {
    const { body: a } = await create();
    expect((await h.call('POST', `/api/v1/automations/${a.id}/disable`)).body.status).to.equal('disabled');
    expect((await h.call('POST', `/api/v1/automations/${a.id}/enable`)).body.status).to.equal('enabled');
    expect((await h.call('DELETE', `/api/v1/automations/${a.id}`)).status).to.equal(204);
    expect((await h.call('DELETE', `/api/v1/automations/${a.id}`)).status).to.equal(204);
    const kept = await h.rt.store.automations.get('tenant-a', a.id);
    expect(kept?.status).to.equal('archived');
    expect((await h.call('GET', `/api/v1/automations/${a.id}`)).body.status).to.equal('archived');
    for (const [method, path, body] of [
      ['POST', `/api/v1/automations/${a.id}/enable`, undefined],
      ['POST', `/api/v1/automations/${a.id}/disable`, undefined],
      ['PATCH', `/api/v1/automations/${a.id}`, { name: 'zombie' }],
    ] as const) {
      const res = await h.call(method, path, { body });
      expect(res.status, `${method} ${path}`).to.equal(409);
      expect(res.body.code).to.equal('conflict');
    }
    expect((await h.rt.store.automations.get('tenant-a', a.id))?.name).to.equal(a.name);
  });

  it('answers 404 to tenant B for every route on tenant A’s automation, and changes nothing', async () => {
    const { body: a } = await create();
    const calls: [string, string, object?][] = [
      ['GET', `/api/v1/automations/${a.id}`],
      ['PATCH', `/api/v1/automations/${a.id}`, { name: 'mine now' }],
      ['POST', `/api/v1/automations/${a.id}/enable`],
      ['POST', `/api/v1/automations/${a.id}/disable`],
      ['DELETE', `/api/v1/automations/${a.id}`],
    ];
    for (const [method, path, body] of calls) {
      const res = await h.call(method, path, { key: KEYS.b, body });
      expect(res.status, `${method} ${path}`).to.equal(404);
      expect(res.body.code).to.equal('not-found');
    }
    const list = await h.call('GET', '/api/v1/automations?include_archived=true&limit=100', { key: KEYS.b });
    expect(list.body.data.map((x: { id: string }) => x.id)).not.to.include(a.id);
    expect(await h.rt.store.automations.get('tenant-a', a.id)).to.deep.equal(a);
  });

  /** The ids of a tenant's automations of one name, archived ones too, as stored (an earlier test keeps one the API would not answer). */
  async function idsNamed(name: string, tenantId = 'tenant-a'): Promise<string[]> {
    const page = await h.rt.store.automations.list(tenantId, { limit: 1000, statuses: ['enabled', 'disabled', 'archived'] });
    return page.items.filter((a) => a.name === name).map((a) => a.id);
  }

  it('makes one automation of creates sent at once with one Idempotency-Key: the others answer it, 201 with Idempotent-Replayed; a retry too', async () => {
    const body = { ...definition, name: 'Once at once' };
    const key = { 'idempotency-key': 'create-at-once' };
    // the three read the key before any of them stores its automation: the window a race needs, every time
    const release = heldTogether(h.rt.store.idempotencyKeys, 'get', 3);
    const answers = await Promise.all(Array.from({ length: 3 }, () => h.call('POST', '/api/v1/automations', { body, headers: key }))).finally(release);
    expect(
      answers.map((r) => r.status),
      answers.map((r) => r.text).join('\n'),
    ).to.deep.equal([201, 201, 201]);
    const ids = new Set(answers.map((r) => r.body.id));
    expect(ids.size, 'one automation answered to all').to.equal(1);
    const [id] = ids;
    expect(answers.filter((r) => r.headers.get('idempotent-replayed') === 'true')).to.have.length(2);
    for (const r of answers) expect(r.headers.get('location')).to.equal(`/api/v1/automations/${id}`);
    expect(await idsNamed('Once at once')).to.deep.equal([id]);
    // one cron trigger to fire, not three
    const cron = await h.rt.store.automations.listEnabledWithTrigger('cron', 'tenant-a');
    expect(cron.filter((a) => a.name === 'Once at once').map((a) => a.id)).to.deep.equal([id]);
    // a retry later, its fields in another order: the same automation, as it is now
    await h.call('PATCH', `/api/v1/automations/${id}`, { body: { description: 'changed since' } });
    const reordered = Object.fromEntries(Object.entries(body).reverse());
    const retry = await h.call('POST', '/api/v1/automations', { body: reordered, headers: key });
    expect(retry.status, retry.text).to.equal(201);
    expect(retry.headers.get('idempotent-replayed')).to.equal('true');
    expect(retry.body).to.deep.include({ id, description: 'changed since' });
    expect(await idsNamed('Once at once')).to.deep.equal([id]);
  });

  it('keeps an Idempotency-Key on the template route as on the create: a retry answers its automation; the same template body sent to either is one request', async () => {
    const body = { template_id: 'nightly-audit', variables: {}, name: 'Templated once' };
    const key = { 'idempotency-key': 'instantiate-once' };
    const first = await h.call('POST', '/api/v1/automations/templates/instantiate', { body, headers: key });
    expect(first.status, first.text).to.equal(201);
    expect(first.headers.get('idempotent-replayed')).to.equal(null);
    for (const path of ['/api/v1/automations/templates/instantiate', '/api/v1/automations']) {
      const again = await h.call('POST', path, { body, headers: key });
      expect(again.status, again.text).to.equal(201);
      expect(again.headers.get('idempotent-replayed'), path).to.equal('true');
      expect(again.body.id).to.equal(first.body.id);
    }
    const other = await h.call('POST', '/api/v1/automations/templates/instantiate', { body: { ...body, name: 'Templated twice' }, headers: key });
    expect(other.status, other.text).to.equal(422);
    expect(await idsNamed('Templated once')).to.deep.equal([first.body.id]);
    expect(await idsNamed('Templated twice')).to.deep.equal([]);
  });

  it('refuses the same Idempotency-Key with another body (422 idempotency-key-reused) and stores nothing; another tenant’s same key is its own', async () => {
    const key = { 'idempotency-key': 'create-reused' };
    const first = await h.call('POST', '/api/v1/automations', { body: { ...definition, name: 'Reused first' }, headers: key });
    expect(first.status, first.text).to.equal(201);
    expect(first.headers.get('idempotent-replayed')).to.equal(null);
    const other = await h.call('POST', '/api/v1/automations', { body: { ...definition, name: 'Reused other' }, headers: key });
    expect(other.status, other.text).to.equal(422);
    expect(other.body.code).to.equal('idempotency-key-reused');
    expect(await idsNamed('Reused other')).to.deep.equal([]);
    // a template body with the key is another body too
    const template = await h.call('POST', '/api/v1/automations', { body: { template_id: 'nightly-audit', variables: {} }, headers: key });
    expect(template.status, template.text).to.equal(422);
    // tenant B's key of the same text: its own automation, not A's, and not a 422
    const b = await h.call('POST', '/api/v1/automations', { key: KEYS.b, body: { ...definition, name: 'Reused other' }, headers: key });
    expect(b.status, b.text).to.equal(201);
    expect(b.headers.get('idempotent-replayed')).to.equal(null);
    expect(b.body).to.deep.include({ tenant_id: 'tenant-b', name: 'Reused other' });
    expect(b.body.id).not.to.equal(first.body.id);
    const bAgain = await h.call('POST', '/api/v1/automations', { key: KEYS.b, body: { ...definition, name: 'Reused other' }, headers: key });
    expect(bAgain.body.id).to.equal(b.body.id);
    expect(bAgain.headers.get('idempotent-replayed')).to.equal('true');
    expect(await idsNamed('Reused other', 'tenant-b')).to.deep.equal([b.body.id]);
    expect(await idsNamed('Reused other')).to.deep.equal([]);
    // a run started with the same text of key is not refused by it: the automations' keys are apart from the runs'
    const run = await h.call('POST', '/api/v1/autonomy/run', { body: { steps: [{ tool: 'message', args: { text: 'x' } }] }, headers: key });
    expect(run.status, run.text).to.equal(202);
  });

  it('keeps no Idempotency-Key for a create it refuses (400): the next request with the key is handled as if it came alone', async () => {
    const key = { 'idempotency-key': 'create-refused' };
    const bad = await h.call('POST', '/api/v1/automations', {
      body: { ...definition, name: 'Refused first', triggers: [{ type: 'cron', schedule: '0 25 * * *', timezone: 'UTC' }] },
      headers: key,
    });
    expect(bad.status, bad.text).to.equal(400);
    // the same key with a good body: made (a key kept by the refusal would make this a 422)
    const body = { ...definition, name: 'Refused then made' };
    const made = await h.call('POST', '/api/v1/automations', { body, headers: key });
    expect(made.status, made.text).to.equal(201);
    expect(made.headers.get('idempotent-replayed')).to.equal(null);
    const again = await h.call('POST', '/api/v1/automations', { body, headers: key });
    expect(again.status).to.equal(201);
    expect(again.headers.get('idempotent-replayed')).to.equal('true');
    expect(again.body.id).to.equal(made.body.id);
    expect(await idsNamed('Refused then made')).to.deep.equal([made.body.id]);
    expect(await idsNamed('Refused first')).to.deep.equal([]);
  });

  it('keeps no Idempotency-Key for a create over the cap (409), and answers a retry of one it made even at the cap', async () => {
    const small = await startHarness({ workers: false, env: { SERVICE_TENANT_MAX_AUTOMATIONS: '1' } });
    try {
      const body = { name: 'capped', steps: [{ tool: 'message', args: { text: 'x' } }] };
      const key = { 'idempotency-key': 'create-capped' };
      const first = await small.call('POST', '/api/v1/automations', { body, headers: key });
      expect(first.status, first.text).to.equal(201);
      // at the cap now: a retry is still its automation, not a 409
      const retry = await small.call('POST', '/api/v1/automations', { body, headers: key });
      expect(retry.status, retry.text).to.equal(201);
      expect(retry.headers.get('idempotent-replayed')).to.equal('true');
      expect(retry.body.id).to.equal(first.body.id);
      // another key over the cap: 409, and its key is not kept
      const other = { 'idempotency-key': 'create-over-cap' };
      const over = await small.call('POST', '/api/v1/automations', { body: { ...body, name: 'over' }, headers: other });
      expect(over.status, over.text).to.equal(409);
      expect(over.headers.get('retry-after')).to.equal(null);
      expect((await small.call('DELETE', `/api/v1/automations/${first.body.id}`)).status).to.equal(204);
      const room = await small.call('POST', '/api/v1/automations', { body: { ...body, name: 'over' }, headers: other });
      expect(room.status, room.text).to.equal(201);
      expect(room.headers.get('idempotent-replayed')).to.equal(null);
      const roomAgain = await small.call('POST', '/api/v1/automations', { body: { ...body, name: 'over' }, headers: other });
      expect(roomAgain.headers.get('idempotent-replayed')).to.equal('true');
      expect(roomAgain.body.id).to.equal(room.body.id);
      expect(await small.rt.store.automations.countLive('tenant-a')).to.equal(1);
    } finally {
      await small.close();
    }
  });
});

describe('automation templates API', () => {
  let h: Harness;
  before(async () => {
    h = await startHarness({ env: AGENT_ENV });
  });
  after(async () => {
    await h.close();
  });

  it('lists exactly the 8 built-in templates with their variables', async () => {
    const res = await h.call('GET', '/api/v1/automations/templates');
    expect(res.status).to.equal(200);
    expect(res.body.data).to.have.length(8);
    for (const t of res.body.data) {
      expect(t).to.include.keys('id', 'name', 'description', 'variables', 'automation');
      for (const v of t.variables) expect(v).to.include.keys('name', 'type', 'required', 'description');
    }
  });

  it('instantiates every template into a valid automation (201)', async () => {
    const templates = (await h.call('GET', '/api/v1/automations/templates')).body.data as {
      id: string;
      variables: { name: string; type: string; required: boolean }[];
    }[];
    for (const t of templates) {
      const variables = Object.fromEntries(t.variables.filter((v) => v.required).map((v) => [v.name, v.name === 'session_id' ? 'ses_example' : 'acme/api']));
      const res = await h.call('POST', '/api/v1/automations/templates/instantiate', { body: { template_id: t.id, variables } });
      expect(res.status, `${t.id}: ${res.text}`).to.equal(201);
      expect(res.body.template).to.deep.include({ id: t.id });
      expect(res.headers.get('location')).to.equal(`/api/v1/automations/${res.body.id}`);
      expect(JSON.stringify(res.body)).not.to.match(/\{\{/);
    }
  });

  it('applies variables and keeps them with the automation; POST /automations takes a template too', async () => {
    const res = await h.call('POST', '/api/v1/automations', {
      body: { template_id: 'nightly-audit', variables: { timezone: 'Asia/Tokyo', schedule: '30 1 * * *' }, name: 'Tokyo audit' },
    });
    expect(res.status).to.equal(201);
    expect(res.body.name).to.equal('Tokyo audit');
    expect(res.body.triggers[0]).to.deep.equal({ type: 'cron', schedule: '30 1 * * *', timezone: 'Asia/Tokyo' });
    expect(res.body.template).to.deep.equal({ id: 'nightly-audit', variables: { schedule: '30 1 * * *', timezone: 'Asia/Tokyo' } });
  });

  it('names a missing required variable and an unknown one (400)', async () => {
    const res = await h.call('POST', '/api/v1/automations/templates/instantiate', { body: { template_id: 'pr-review', variables: { colour: 'blue' } } });
    expect(res.status).to.equal(400);
    expect(res.body.errors.map((e: { path: string }) => e.path).sort()).to.deep.equal(['/body/variables/colour', '/body/variables/repository']);
    expect(res.body.detail).to.contain('colour').and.contain('repository');
    // a required value of blanks is none; a value with ${ would be read by the run as one of its references
    const blank = await h.call('POST', '/api/v1/automations/templates/instantiate', { body: { template_id: 'pr-review', variables: { repository: '  ' } } });
    expect(blank.status).to.equal(400);
    expect(blank.body.errors[0].path).to.equal('/body/variables/repository');
    const reference = await h.call('POST', '/api/v1/automations/templates/instantiate', {
      body: { template_id: 'gates-on-push', variables: { repository: '${inputs.event.repository.full_name}' } },
    });
    expect(reference.status, reference.text).to.equal(400);
    expect(reference.body.errors).to.deep.include({
      path: '/body/variables/repository',
      message: 'must not hold ${: steps read it as a reference to the run’s inputs or steps',
    });
  });

  it('refuses an unknown template and a variable that makes a bad trigger', async () => {
    const unknown = await h.call('POST', '/api/v1/automations/templates/instantiate', { body: { template_id: 'no-such-template' } });
    expect(unknown.status).to.equal(400);
    expect(unknown.body.errors[0].path).to.equal('/body/template_id');
    const zone = await h.call('POST', '/api/v1/automations/templates/instantiate', {
      body: { template_id: 'nightly-audit', variables: { timezone: 'Moon/Base' } },
    });
    expect(zone.status).to.equal(400);
    expect(zone.body.errors[0].path).to.equal('/body/triggers/0/timezone');
    const before = await h.call('GET', '/api/v1/automations?limit=100');
    expect(before.body.data.filter((a: { triggers: { timezone?: string }[] }) => a.triggers[0]?.timezone === 'Moon/Base')).to.have.length(0);
  });

  it('holds what a template makes to the limits of a definition posted directly: a budget of 0, a name of 5,000 characters', async () => {
    const count = async () => (await h.call('GET', '/api/v1/automations?limit=100')).body.data.length as number;
    const before = await count();
    const zero = await h.call('POST', '/api/v1/automations/templates/instantiate', {
      body: { template_id: 'pr-review', variables: { repository: 'acme/api', budget_seconds: 0 } },
    });
    expect(zero.status, zero.text).to.equal(400);
    expect(zero.body.errors[0].path).to.equal('/body/variables');
    expect(zero.body.errors[0].message).to.contain('/budget/seconds');
    const long = await h.call('POST', '/api/v1/automations/templates/instantiate', {
      body: { template_id: 'gates-on-push', variables: { repository: `acme/${'x'.repeat(5000)}` } },
    });
    expect(long.status, long.text).to.equal(400);
    expect(await count(), 'nothing stored').to.equal(before);
  });
});
