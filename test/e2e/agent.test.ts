// Goal-driven runs: the real HTTP client of the agent loop against a local server that plays a
// scripted OpenAI-compatible conversation with tool calls.
import fs from 'node:fs/promises';
import path from 'node:path';
import { expect } from 'chai';
import { eventually, finishedRun, startHarness, type Harness } from '../support/harness.js';
import { startScriptedModel, type ScriptedModel, type ScriptedTurn } from '../support/scripted-model.js';

type RunBody = Record<string, any>;

async function withAgent(script: ScriptedTurn[], fn: (h: Harness, model: ScriptedModel) => Promise<void>, env: Record<string, string> = {}) {
  const model = await startScriptedModel(script);
  const h = await startHarness({
    env: { SERVICE_AGENT_BASE_URL: model.url, SERVICE_AGENT_API_KEY: 'sk-model-secret-123', SERVICE_AGENT_MODEL: 'scripted-1', ...env },
  });
  try {
    await fn(h, model);
  } finally {
    await h.close();
    await model.close();
  }
}

const finished = (h: Harness, id: string) => finishedRun(h, id);

describe('agent runs', function () {
  this.timeout(30_000);

  it('lists a plan with an agent step as it ran: the agent’s tool calls, then the plan’s own steps once each', async () => {
    const script: ScriptedTurn[] = [
      { tool_calls: [{ name: 'write_file', args: { path: 'agent.txt', content: 'x' } }] },
      { content: 'Done.' },
      { content: 'Checked.' },
    ];
    await withAgent(script, async (h) => {
      const res = await h.call('POST', '/api/v1/autonomy/run', {
        body: {
          steps: [
            { tool: 'agent', args: { goal: 'write a file' } },
            { tool: 'agent', args: { goal: 'check it' } },
            { tool: 'message', args: { text: 'after' } },
            { tool: 'shell', args: { command: 'exit 1' } },
            { tool: 'message', args: { text: 'never' } },
          ],
          tools: ['agent', 'write_file', 'message', 'shell'],
        },
      });
      expect(res.status, res.text).to.equal(202);
      const run = await finished(h, res.body.run_id);
      expect(run.status).to.equal('failed');
      expect(run.steps.map((s: RunBody) => [s.tool, s.source, s.status])).to.deep.equal([
        ['write_file', 'agent', 'succeeded'],
        ['message', 'plan', 'succeeded'],
        ['shell', 'plan', 'failed'],
        ['message', 'plan', 'skipped'],
      ]);
      // the turns of the attempt's two agent steps, one after another: the second's did not write over the first's
      expect(run.agent_turns.map((t: RunBody) => [t.index, t.content ?? t.tool_calls[0].tool])).to.deep.equal([
        [0, 'write_file'],
        [1, 'Done.'],
        [2, 'Checked.'],
      ]);
      expect(run.usage.model_turns).to.equal(3);
    });
  });

  it('plans steps through the model until it answers without a tool call', async () => {
    const script: ScriptedTurn[] = [
      { content: 'I will write the file first.', tool_calls: [{ name: 'write_file', args: { path: 'out/answer.txt', content: '42' } }] },
      { tool_calls: [{ name: 'read_file', args: { path: 'out/answer.txt' } }] },
      { content: 'The answer is 42.\nDetails follow.' },
    ];
    await withAgent(script, async (h, model) => {
      const res = await h.call('POST', '/api/v1/autonomy/run', {
        body: { goal: 'Find the answer', tools: ['read_file', 'write_file'], inputs: { topic: 'life' } },
      });
      expect(res.status).to.equal(202);
      const run = await finished(h, res.body.run_id);
      expect(run.status, JSON.stringify(run.error)).to.equal('succeeded');
      expect(run.summary).to.equal('The answer is 42.');
      expect(run.result.final_answer).to.equal('The answer is 42.\nDetails follow.');
      expect(run.steps.map((s: RunBody) => [s.tool, s.source, s.status])).to.deep.equal([
        ['write_file', 'agent', 'succeeded'],
        ['read_file', 'agent', 'succeeded'],
      ]);
      expect(run.steps[1].output.content).to.equal('42');
      expect(run.agent_turns).to.have.length(3);
      expect(run.agent_turns[0].tool_calls[0]).to.deep.include({ tool: 'write_file' });
      expect(run.usage.model_turns).to.equal(3);
      expect(await fs.readFile(path.join(h.tenantDir(), 'out/answer.txt'), 'utf8')).to.equal('42');

      // what the model was sent: the goal, only the allowed tools, the tool results, the key
      expect(model.requests).to.have.length(3);
      const first = model.requests[0]!;
      expect(first.headers.authorization).to.equal('Bearer sk-model-secret-123');
      expect(first.body.model).to.equal('scripted-1');
      expect(first.body.tools.map((t: RunBody) => t.function.name).sort()).to.deep.equal(['read_file', 'write_file']);
      expect(first.body.messages[1].content).to.contain('Find the answer').and.contain('life');
      const third = model.requests[2]!.body.messages;
      expect(third.filter((m: RunBody) => m.role === 'tool')).to.have.length(2);
      expect(third[third.length - 1].content).to.contain('42');

      const events = await h.rt.events.after(`session:${res.body.session_id}`, '0-0');
      expect(events.filter((e) => e.type === 'agent.turn')).to.have.length(3);
      expect(h.logs.join('')).not.to.contain('sk-model-secret-123');
    });
  });

  it('refuses a tool call outside the allowlist and tells the model', async () => {
    const script: ScriptedTurn[] = [{ tool_calls: [{ name: 'shell', args: { command: 'touch pwned' } }] }, { content: 'Could not run it.' }];
    await withAgent(script, async (h, model) => {
      const res = await h.call('POST', '/api/v1/autonomy/run', { body: { goal: 'try to escape', tools: ['read_file'] } });
      const run = await finished(h, res.body.run_id);
      expect(run.steps[0]).to.deep.include({ tool: 'shell', status: 'failed' });
      expect(run.steps[0].error.code).to.equal('tool-not-allowed');
      expect(await fs.stat(path.join(h.tenantDir(), 'pwned')).catch(() => null)).to.equal(null);
      expect(model.requests[1]!.body.messages.at(-1).content).to.contain('tool-not-allowed');
    });
  });

  it('refuses a plan’s agent step that the run’s allowlist does not name, before the model is called', async () => {
    await withAgent([{ content: 'I ran anyway.' }], async (h, model) => {
      const res = await h.call('POST', '/api/v1/autonomy/run', {
        body: {
          steps: [
            { tool: 'agent', args: { goal: 'do things' } },
            { tool: 'read_file', args: { path: 'x' } },
          ],
          tools: ['read_file'],
        },
      });
      expect(res.status, res.text).to.equal(202);
      const run = await finished(h, res.body.run_id);
      expect(run.status).to.equal('failed');
      expect(run.error.code).to.equal('tool-not-allowed');
      expect(run.steps.map((s: RunBody) => [s.tool, s.status, s.error?.code])).to.deep.equal([['agent', 'failed', 'tool-not-allowed']]);
      expect(model.requests, 'the model was never called').to.have.length(0);
    });
  });

  it('stops at max_steps, and fails with agent-error when the endpoint fails', async () => {
    const loop: ScriptedTurn[] = [{ tool_calls: [{ name: 'list_files', args: {} }] }];
    await withAgent(loop, async (h) => {
      const res = await h.call('POST', '/api/v1/autonomy/run', { body: { goal: 'list forever', tools: ['list_files'], max_steps: 3 } });
      const run = await finished(h, res.body.run_id);
      expect(run.status).to.equal('failed');
      expect(run.error.code).to.equal('max-steps-reached');
      expect(run.steps).to.have.length(3);
    });
    await withAgent(
      [{ status: 500 }],
      async (h, model) => {
        const res = await h.call('POST', '/api/v1/autonomy/run', { body: { goal: 'anything' } });
        const run = await finished(h, res.body.run_id);
        expect(run.status).to.equal('failed');
        expect(run.error.code).to.equal('agent-error');
        expect(run.error.message).to.equal('the model endpoint answered HTTP 500 (after 2 tries)');
        expect(model.requests).to.have.length(2);
      },
      { SERVICE_AGENT_MAX_RETRIES: '1' },
    );
  });

  it('stores and serves a model’s lone surrogates (in its text, a call’s arguments) as U+FFFD: what it serves is well-formed Unicode, as what a request may send', async () => {
    const script: ScriptedTurn[] = [
      { content: 'thinking \ud800', tool_calls: [{ name: 'message', args: {}, raw: '{"text":"x\\ud800y"}' }] },
      { content: 'done \udc00 end' },
    ];
    await withAgent(script, async (h) => {
      const res = await h.call('POST', '/api/v1/autonomy/run', { body: { goal: 'say it', tools: ['message'] } });
      const run = await finished(h, res.body.run_id);
      expect(run.status, JSON.stringify(run.steps)).to.equal('succeeded');
      expect(run.steps[0].args).to.deep.equal({ text: 'x\ufffdy' });
      expect(run.result.final_answer).to.equal('done \ufffd end');
      // no escape of a lone surrogate anywhere in what the API serves of the run: its record, its page of the list, its events
      const lone = /(?<!\\)(?:\\\\)*\\u[dD][89a-fA-F][0-9a-fA-F]{2}/;
      for (const url of [`/api/v1/runs/${run.id}`, '/api/v1/runs?limit=10']) expect((await h.call('GET', url)).text).not.to.match(lone);
      const events = await h.rt.events.after(`session:${run.session_id}`, '0-0');
      expect(JSON.stringify(events)).not.to.match(lone);
    });
  });

  it('refuses a tool call whose arguments are not a JSON object, as a failed step the model is told of, without calling the tool', async () => {
    const script: ScriptedTurn[] = [
      { tool_calls: [{ name: 'list_files', args: {}, raw: '{"path": "sub' }] },
      { tool_calls: [{ name: 'list_files', args: {}, raw: '["sub"]' }] },
      { content: 'Gave up on listing.' },
    ];
    await withAgent(script, async (h, model) => {
      const res = await h.call('POST', '/api/v1/autonomy/run', { body: { goal: 'list sub', tools: ['list_files'] } });
      const run = await finished(h, res.body.run_id);
      expect(run.status, JSON.stringify(run.steps)).to.equal('succeeded');
      expect(run.steps.map((s: Record<string, any>) => [s.status, s.error?.code, s.args])).to.deep.equal([
        ['failed', 'invalid-args', { invalid_arguments: '{"path": "sub' }],
        ['failed', 'invalid-args', { invalid_arguments: '["sub"]' }],
      ]);
      // the model hears why, where it was answered a listing of the workspace as if its call had worked
      const told = model.requests[1]!.body.messages.at(-1);
      expect(told.role).to.equal('tool');
      expect(told.content).to.contain('invalid-args');
      expect(told.content).not.to.contain('"files"');
    });
  });

  it('retries a 429 after its Retry-After and a 503, then goes on', async () => {
    await withAgent([{ status: 429, headers: { 'retry-after': '1' } }, { status: 503 }, { content: 'Done after the rate limit.' }], async (h, model) => {
      const res = await h.call('POST', '/api/v1/autonomy/run', { body: { goal: 'be patient' } });
      const run = await finished(h, res.body.run_id);
      expect(run.status, JSON.stringify(run.error)).to.equal('succeeded');
      expect(run.result.final_answer).to.equal('Done after the rate limit.');
      expect(model.requests).to.have.length(3);
      // the second request waited for the Retry-After of the first answer
      expect(model.requests[1]!.at - model.requests[0]!.at).to.be.at.least(950);
      expect(run.usage.model_turns).to.equal(1);
    });
  });

  it('backs off when a Retry-After cannot be read (a word, a negative number), and tries an HTTP date’s wait', async () => {
    const soon = new Date(Date.now() + 2000).toUTCString();
    const script: ScriptedTurn[] = [
      { status: 429, headers: { 'retry-after': 'soon' } },
      { status: 503, headers: { 'retry-after': '-5' } },
      { status: 429, headers: { 'retry-after': soon } },
      { content: 'Done.' },
    ];
    await withAgent(script, async (h, model) => {
      const res = await h.call('POST', '/api/v1/autonomy/run', { body: { goal: 'be patient' } });
      const run = await finished(h, res.body.run_id);
      expect(run.status, JSON.stringify(run.error)).to.equal('succeeded');
      const gaps = model.requests.slice(1).map((r, i) => r.at - model.requests[i]!.at);
      // the backoff's first two waits are 0.5 s and 1 s, less up to a quarter (the SDK's own retries read these as no wait)
      expect(gaps[0]).to.be.at.least(350);
      expect(gaps[1]).to.be.at.least(700);
      // the date names a whole second: at least what is left of it
      expect(model.requests[3]!.at).to.be.at.least(Date.parse(soon) - 50);
    });
  });

  it('fails a call at once when the endpoint asks for a wait past the run’s budget, naming it', async () => {
    await withAgent([{ status: 429, headers: { 'retry-after': '30' } }, { content: 'too late' }], async (h, model) => {
      const res = await h.call('POST', '/api/v1/autonomy/run', { body: { goal: 'be patient', budget_seconds: 10 } });
      const run = await finished(h, res.body.run_id);
      expect(run.status).to.equal('failed');
      expect(run.error.code).to.equal('agent-error');
      expect(run.error.message).to.match(
        /^the model endpoint answered HTTP 429 \(after 1 try\); the next try was asked for in 30 s, after the run's budget ends \(\d+(\.\d)? s left\)$/,
      );
      // not at the budget's end (10 s), nor after the 30 s asked for
      expect(run.duration_ms).to.be.below(2000);
      expect(model.requests).to.have.length(1);
    });
  });

  it('times a model call out', async () => {
    await withAgent(
      [{ content: 'too late', delay_ms: 2500 }],
      async (h, model) => {
        const res = await h.call('POST', '/api/v1/autonomy/run', { body: { goal: 'wait for the model' } });
        const run = await finished(h, res.body.run_id);
        expect(run.status).to.equal('failed');
        expect(run.error).to.deep.equal({ code: 'agent-error', message: 'the model endpoint did not answer within 1 s (after 1 try)' });
        expect(run.duration_ms).to.be.below(3000);
        expect(model.requests).to.have.length(1);
      },
      { SERVICE_AGENT_TIMEOUT_SECONDS: '1', SERVICE_AGENT_MAX_RETRIES: '0' },
    );
  });

  it('times a model call out when its body stalls after the headers, and retries it as a timeout', async () => {
    await withAgent(
      [{ content: 'too late', stall_ms: 5000 }],
      async (h, model) => {
        const res = await h.call('POST', '/api/v1/autonomy/run', { body: { goal: 'wait for the body' } });
        const run = await finished(h, res.body.run_id);
        expect(run.status).to.equal('failed');
        expect(run.error).to.deep.equal({ code: 'agent-error', message: 'the model endpoint did not answer within 1 s (after 2 tries)' });
        // two tries of 1 s and the wait between them, not the 5 s of the stalled body
        expect(run.duration_ms).to.be.below(4000);
        expect(model.requests).to.have.length(2);
      },
      { SERVICE_AGENT_TIMEOUT_SECONDS: '1', SERVICE_AGENT_MAX_RETRIES: '1' },
    );
  });

  it('reads an answer of another shape the protocol allows, and fails one it cannot read with agent-protocol, not internal', async () => {
    const answer = (message: Record<string, unknown>, usage?: unknown) => ({
      raw: { id: 'chatcmpl-x', object: 'chat.completion', choices: [{ index: 0, message: { role: 'assistant', ...message }, finish_reason: 'stop' }], usage },
    });
    const call = (fn: unknown) => ({ id: 'call_1', type: 'function', function: fn });
    const script: ScriptedTurn[] = [
      // arguments as an object, content as text parts; token counts as text and below zero count for nothing
      answer(
        {
          content: [
            { type: 'text', text: 'Saying ' },
            { type: 'text', text: 'hi.' },
          ],
          tool_calls: [call({ name: 'message', arguments: { text: 'hi' } })],
        },
        { prompt_tokens: '10', completion_tokens: -5 },
      ),
      answer({ content: [{ type: 'text', text: 'Done.' }] }, { prompt_tokens: 3, completion_tokens: 2 }),
      // what cannot be read: one run each
      answer({ content: null, tool_calls: [call({ name: 'message', arguments: 42 })] }),
      answer({ content: null, tool_calls: [{ id: 'call_1', type: 'function' }] }),
      answer({ content: null, tool_calls: { id: 'call_1', function: { name: 'message', arguments: '{}' } } }),
      answer({ content: 42 }),
      answer({ content: [{ type: 'image_url', image_url: { url: 'x' } }] }),
      answer({ content: null, tool_calls: [call({ name: 42, arguments: '{}' })] }),
    ];
    await withAgent(
      script,
      async (h) => {
        const start = async () =>
          (await h.call<RunBody>('POST', '/api/v1/autonomy/run', { body: { goal: 'say hi', tools: ['message'] } })).body.run_id as string;
        const read = await finished(h, await start());
        expect(read.status, JSON.stringify(read.error)).to.equal('succeeded');
        expect(read.steps.map((s: RunBody) => [s.tool, s.args, s.status])).to.deep.equal([['message', { text: 'hi' }, 'succeeded']]);
        expect(read.agent_turns[0].content).to.equal('Saying hi.');
        expect(read.result.final_answer).to.equal('Done.');
        expect(read.usage).to.deep.include({ prompt_tokens: 3, completion_tokens: 2 });
        for (let i = 0; i < 6; i++) {
          const run = await finished(h, await start());
          expect(run.status, `answer ${i + 3}`).to.equal('failed');
          expect(run.error.code, `answer ${i + 3}: ${run.error.message}`).to.equal('agent-protocol');
          expect(run.steps, `answer ${i + 3}`).to.deep.equal([]);
        }
        expect(h.logs.join('')).not.to.contain('TypeError');
      },
      { SERVICE_AGENT_MAX_RETRIES: '0' },
    );
  });

  it('ends timed_out when the budget runs out during the agent loop', async () => {
    await withAgent([{ tool_calls: [{ name: 'shell', args: { command: 'sleep 20' } }] }], async (h) => {
      const res = await h.call('POST', '/api/v1/autonomy/run', { body: { goal: 'wait', tools: ['shell'], budget_seconds: 1 } });
      const run = await finished(h, res.body.run_id);
      expect(run.status).to.equal('timed_out');
      // not when the tool call ends (20 s)
      expect(new Date(run.finished_at).getTime() - new Date(run.started_at).getTime()).to.be.below(8000);
    });
  });
  it('bounds the steps of an agent’s run that names no max_steps by SERVICE_RUN_DEFAULT_MAX_STEPS', async () => {
    // a model that would call tools for good: each step is kept with the run (up to 64 KB of output each)
    const script: ScriptedTurn[] = Array.from({ length: 12 }, () => ({ tool_calls: [{ name: 'message', args: { text: 'again' } }] }));
    await withAgent(
      script,
      async (h) => {
        const res = await h.call<RunBody>('POST', '/api/v1/autonomy/run', { body: { goal: 'talk forever', tools: ['message'] } });
        expect(res.status, res.text).to.equal(202);
        const run = await finished(h, res.body.run_id);
        expect(run.budget.max_steps).to.equal(3);
        expect(run.status).to.equal('failed');
        expect(run.error.code).to.equal('max-steps-reached');
        expect(run.steps).to.have.length(3);
        // a run that names its own bound keeps it, and a run of steps alone has none but its plan
        const named = await h.call<RunBody>('POST', '/api/v1/autonomy/run', { body: { goal: 'talk', tools: ['message'], max_steps: 5 } });
        expect((await h.call<RunBody>('GET', `/api/v1/runs/${named.body.run_id}`)).body.budget.max_steps).to.equal(5);
        const plain = await h.call<RunBody>('POST', '/api/v1/autonomy/run', { body: { steps: [{ tool: 'message', args: { text: 'hi' } }] } });
        expect((await h.call<RunBody>('GET', `/api/v1/runs/${plain.body.run_id}`)).body.budget).to.not.have.property('max_steps');
        // a plan's `agent` step is such a loop as well: its plan's steps, and the bound on top (it had none: 755 steps in 3 s)
        const planned = await h.call<RunBody>('POST', '/api/v1/autonomy/run', {
          body: {
            steps: [
              { tool: 'message', args: { text: 'first' } },
              { tool: 'agent', args: { goal: 'talk forever' } },
            ],
            tools: ['agent', 'message'],
          },
        });
        expect(planned.status, planned.text).to.equal(202);
        const loop = await finished(h, planned.body.run_id);
        expect(loop.budget.max_steps).to.equal(2 + 3);
        expect(loop.error.code).to.equal('max-steps-reached');
        expect(loop.steps.length).to.be.at.most(5);
      },
      { SERVICE_RUN_DEFAULT_MAX_STEPS: '3' },
    );
  });
  it('keeps what each retried attempt used (its tool calls and model tokens), not only the last attempt’s', async () => {
    // attempt 1: a turn with a tool call, then the endpoint refuses (400): the attempt fails; attempt 2 answers
    const script: ScriptedTurn[] = [{ tool_calls: [{ name: 'message', args: { text: 'one' } }] }, { status: 400 }, { content: 'Done.' }];
    await withAgent(
      script,
      async (h) => {
        const res = await h.call<RunBody>('POST', '/api/v1/autonomy/run', {
          body: { goal: 'say one', tools: ['message'], retry: { attempts: 2, backoff: { type: 'fixed', delay_ms: 50 } } },
        });
        expect(res.status, res.text).to.equal(202);
        const run = await finished(h, res.body.run_id);
        expect(run.status, JSON.stringify(run.error)).to.equal('succeeded');
        expect(run.usage).to.deep.include({ steps: 0, model_turns: 1, prompt_tokens: 10, completion_tokens: 5 });
        // the tokens the first attempt spent had been dropped with its usage when it was retried
        expect(run.attempts[0].usage).to.deep.include({ steps: 1, model_turns: 1, prompt_tokens: 10, completion_tokens: 5 });
        expect(run.attempts[0].usage.seconds).to.be.above(0);
      },
      { SERVICE_AGENT_MAX_RETRIES: '0' },
    );
  });
});

describe('vibe runs', function () {
  this.timeout(30_000);
  it('lists the first 1,000 paths it changed (256 KB of names at most), and its end tells those within 4 KB: 100,000 made files were 21 MB in one record and event', async () => {
    const h = await startHarness();
    try {
      await fs.mkdir(path.join(h.tenantDir(), 'many'));
      const make = (count: number, width: number) => `i=0; while [ $i -lt ${count} ]; do : > "$(printf '%0${width}d' $i)"; i=$((i+1)); done`;
      const vibe = async (command: string) => {
        const res = await h.call('POST', '/api/v1/autonomy/vibe/run', { body: { workspace: 'many', steps: [{ tool: 'shell', args: { command } }] } });
        const run = await finished(h, res.body.run_id);
        expect(run.status, JSON.stringify(run.error)).to.equal('succeeded');
        const events = await h.rt.events.after(`session:${run.session_id}`, '0-0');
        return { run, told: events.find((e) => e.type === 'run.finished')!.data as Record<string, any> };
      };
      // by count: 1,500 short names
      const counted = await vibe(make(1500, 6));
      expect(counted.run.result.changed_files).to.have.length(1000);
      expect(counted.run.result.changed_files[0]).to.equal('000000');
      expect(counted.run.result.changed_files_truncated).to.equal(true);
      expect(JSON.stringify(counted.told.result).length).to.be.at.most(4096 + 40);
      expect(counted.told.result.changed_files_truncated).to.equal(true);
      expect(counted.run.result.changed_files.slice(0, counted.told.result.changed_files.length)).to.deep.equal(counted.told.result.changed_files);
      // by bytes: 1,400 names of 200 characters (280 KB), none cut in part
      const sized = await vibe(make(1400, 200));
      const names: string[] = sized.run.result.changed_files;
      expect(names.length).to.be.below(1400);
      expect(names.reduce((n, f) => n + f.length + 1, 0)).to.be.at.most(256 * 1024);
      expect(names.every((f) => f.length === 200)).to.equal(true);
      expect(sized.run.result.changed_files_truncated).to.equal(true);
      // a run that changed a few: all of them, nothing said cut
      const few = await vibe(make(3, 3));
      expect(few.run.result.changed_files).to.deep.equal(['000', '001', '002']);
      expect(few.run.result).to.not.have.property('changed_files_truncated');
      expect(few.told.result).to.deep.equal({ changed_files: ['000', '001', '002'] });
    } finally {
      await h.close();
    }
  });

  it('changes a scratch worktree, not the repository, and returns the diff', async () => {
    const h = await startHarness();
    try {
      const { execFileSync: git } = await import('node:child_process');
      const repo = path.join(h.tenantDir(), 'repo');
      await fs.mkdir(repo);
      await fs.writeFile(path.join(repo, 'README.md'), 'hello\n');
      const g = (...args: string[]) => git('git', ['-c', 'user.name=t', '-c', 'user.email=t@t', ...args], { cwd: repo });
      g('init', '-q');
      g('add', '-A');
      g('commit', '-qm', 'init');
      const res = await h.call('POST', '/api/v1/autonomy/vibe/run', {
        body: {
          workspace: 'repo',
          steps: [
            { tool: 'write_file', args: { path: 'README.md', content: 'hello, world\n' } },
            { tool: 'write_file', args: { path: 'src/new.txt', content: 'new\n' } },
          ],
        },
      });
      expect(res.status).to.equal(202);
      const run = await finished(h, res.body.run_id);
      expect(run.status, JSON.stringify(run.error)).to.equal('succeeded');
      expect(run.kind).to.equal('vibe');
      expect(run.result.changed_files).to.deep.equal(['README.md', 'src/new.txt']);
      expect(run.result.diff).to.contain('-hello\n+hello, world').and.contain('+++ b/src/new.txt');
      expect(await fs.readFile(path.join(repo, 'README.md'), 'utf8')).to.equal('hello\n');
      expect(await fs.stat(path.join(repo, 'src')).catch(() => null)).to.equal(null);
      expect(g('worktree', 'list').toString().trim().split('\n')).to.have.length(1);
    } finally {
      await h.close();
    }
  });

  it('runs git for its scratch copy in the sandbox: the repository’s hooks, fsmonitor and filters never run on the host, and a .git file pointing elsewhere is not followed', async () => {
    const h = await startHarness();
    try {
      const { execFileSync: git } = await import('node:child_process');
      const marker = path.join(h.config.dataDir, `ran-on-host-${Date.now()}`);
      const program = path.join(h.config.dataDir, 'plant.sh');
      await fs.writeFile(program, `#!/bin/sh\ntouch '${marker}'\n`, { mode: 0o755 });
      const repo = path.join(h.tenantDir(), 'hooked');
      await fs.mkdir(repo);
      const g = (cwd: string, ...args: string[]) => git('git', ['-c', 'user.name=t', '-c', 'user.email=t@t', ...args], { cwd });
      g(repo, 'init', '-q');
      await fs.writeFile(path.join(repo, 'a.txt'), 'one\n');
      await fs.writeFile(path.join(repo, '.gitattributes'), '* filter=plant\n');
      g(repo, 'add', '-A');
      g(repo, 'commit', '-qm', 'init');
      // what the tenant's repository asks git to run: a hook on checkout, an fsmonitor, a clean and smudge filter
      await fs.writeFile(path.join(repo, '.git', 'hooks', 'post-checkout'), `#!/bin/sh\n${program}\n`, { mode: 0o755 });
      g(repo, 'config', 'core.fsmonitor', program);
      g(repo, 'config', 'filter.plant.clean', program);
      g(repo, 'config', 'filter.plant.smudge', program);
      // another tenant's repository, and a workspace whose .git file points at it
      const other = path.join(h.tenantDir('tenant-b'), 'secret');
      await fs.mkdir(other, { recursive: true });
      g(other, 'init', '-q');
      await fs.writeFile(path.join(other, 's.txt'), 'tenant b only\n');
      g(other, 'add', '-A');
      g(other, 'commit', '-qm', 'b');
      const pointer = path.join(h.tenantDir(), 'pointer');
      await fs.mkdir(pointer);
      await fs.writeFile(path.join(pointer, '.git'), `gitdir: ${path.join(other, '.git')}\n`);
      await fs.writeFile(path.join(pointer, 'mine.txt'), 'mine\n');

      const hooked = await h.call('POST', '/api/v1/autonomy/vibe/run', {
        body: { workspace: 'hooked', steps: [{ tool: 'shell', args: { command: `echo two >> a.txt; git config core.fsmonitor '${program}' || true` } }] },
      });
      const run = await finished(h, hooked.body.run_id);
      expect(run.status, JSON.stringify(run.error)).to.equal('succeeded');
      expect(run.result.changed_files).to.deep.equal(['a.txt']);
      const pointed = await h.call('POST', '/api/v1/autonomy/vibe/run', {
        body: { workspace: 'pointer', steps: [{ tool: 'shell', args: { command: 'ls; cat s.txt || true' } }] },
      });
      const second = await finished(h, pointed.body.run_id);
      expect(second.status, JSON.stringify(second.error)).to.equal('succeeded');
      expect(second.steps[0].output.stdout).to.contain('mine.txt').and.not.contain('tenant b only');
      // nothing the repositories named ran as the service
      expect(await fs.stat(marker).catch(() => null), 'a program of the tenant’s repository ran on the host').to.equal(null);
      expect(await fs.readFile(path.join(repo, 'a.txt'), 'utf8')).to.equal('one\n');
      expect(g(other, 'status', '--porcelain').toString()).to.equal('');
    } finally {
      await h.close();
    }
  });

  it('keeps what a run changed when its budget runs out: timed_out, with the diff taken in its grace', async () => {
    const h = await startHarness();
    try {
      await fs.writeFile(path.join(h.tenantDir(), 'a.txt'), 'one\n');
      const res = await h.call('POST', '/api/v1/autonomy/vibe/run', {
        body: {
          // time for the scratch copy and the write on a loaded machine (at 1 s the budget could run out before them)
          budget_seconds: 3,
          steps: [
            { tool: 'write_file', args: { path: 'a.txt', content: 'one\nbefore the budget ran out\n' } },
            { tool: 'shell', args: { command: 'sleep 20' } },
          ],
        },
      });
      const started = Date.now();
      const run = await finished(h, res.body.run_id);
      expect(run.status).to.equal('timed_out');
      expect(Date.now() - started).to.be.below(10_000);
      expect(run.result.changed_files).to.deep.equal(['a.txt']);
      expect(run.result.diff).to.contain('+before the budget ran out');
    } finally {
      await h.close();
    }
  });

  it('stops making its scratch copy when its budget runs out: timed_out, not an internal failure', async () => {
    const h = await startHarness();
    const spawn = h.rt.sandbox.spawn.bind(h.rt.sandbox);
    try {
      // the copy of the workspace made slow (a very large folder)
      h.rt.sandbox.spawn = (argv, o) => spawn(argv.some((a) => a.includes('tar -C')) ? ['/bin/sh', '-c', 'sleep 30; exec "$@"', 'slow', ...argv] : argv, o);
      await fs.writeFile(path.join(h.tenantDir(), 'a.txt'), 'one\n');
      const started = Date.now();
      const res = await h.call('POST', '/api/v1/autonomy/vibe/run', { body: { budget_seconds: 1, steps: [{ tool: 'message', args: { text: 'never' } }] } });
      const run = await finished(h, res.body.run_id);
      expect(run.status).to.equal('timed_out');
      expect(run.error.code).to.equal('budget-exceeded');
      expect(Date.now() - started).to.be.below(10_000);
    } finally {
      h.rt.sandbox.spawn = spawn;
      await h.close();
    }
  });

  it('works on a copy of a folder that is not a repository', async () => {
    const h = await startHarness();
    try {
      await fs.writeFile(path.join(h.tenantDir(), 'a.txt'), 'one\n');
      const res = await h.call('POST', '/api/v1/autonomy/vibe/run', { body: { steps: [{ tool: 'shell', args: { command: 'echo two >> a.txt' } }] } });
      const run = await finished(h, res.body.run_id);
      expect(run.status).to.equal('succeeded');
      expect(run.result.changed_files).to.deep.equal(['a.txt']);
      expect(run.result.diff).to.contain('+two');
      expect(await fs.readFile(path.join(h.tenantDir(), 'a.txt'), 'utf8')).to.equal('one\n');
    } finally {
      await h.close();
    }
  });

  it('runs a session task with a goal through its agent, and sums the model’s tokens per run, task and session', async () => {
    await withAgent([{ content: 'Reviewed.' }], async (h, model) => {
      const session = (await h.call<RunBody>('POST', '/api/v1/sessions', { body: { title: 'agents' } })).body;
      const agent = (
        await h.call<RunBody>('POST', `/api/v1/sessions/${session.id}/agents`, {
          body: { name: 'reviewer', instructions: 'Be brief.', tool_allowlist: ['read_file'] },
        })
      ).body;
      const added = await h.call<RunBody>('POST', `/api/v1/sessions/${session.id}/tasks`, {
        body: { id: 'review', goal: 'Review the change', agent_id: agent.id },
      });
      expect(added.status, added.text).to.equal(201);
      const done = await eventually(async () => {
        const s = (await h.call<RunBody>('GET', `/api/v1/sessions/${session.id}`)).body;
        return s.outcome ? s : null;
      }, 'the task to end');
      expect(done.outcome).to.equal('succeeded');
      expect(done.usage).to.deep.equal({ prompt_tokens: 10, completion_tokens: 5 });
      const run = await finished(h, done.tasks[0].run_ids[0]);
      expect(run.usage).to.deep.include({ model_turns: 1, prompt_tokens: 10, completion_tokens: 5 });
      // the agent's instructions lead the goal it is given
      expect(JSON.stringify(model.requests[0]!.body.messages)).to.contain('Be brief.').and.contain('Review the change');
    });
  });
});
