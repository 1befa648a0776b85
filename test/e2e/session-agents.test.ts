// The agents of a multi-agent session against a local scripted chat-completions server: an agent's own
// model, its inbox read between turns, a question that ends its run and an answer that continues the
// task in a new run, and messages from one agent to another.
import { expect } from 'chai';
import { eventually, finishedRun, heldTogether, startHarness, type Harness } from '../support/harness.js';
import { startScriptedModel, type ScriptedModel, type ScriptedTurn } from '../support/scripted-model.js';

type Body = Record<string, any>;

async function withAgents(script: ScriptedTurn[], fn: (h: Harness, model: ScriptedModel, session: string) => Promise<void>) {
  const model = await startScriptedModel(script);
  const h = await startHarness({ env: { SERVICE_AGENT_BASE_URL: model.url, SERVICE_AGENT_MODEL: 'default-model' } });
  try {
    const session = (await h.call<Body>('POST', '/api/v1/sessions', { body: { title: 'agents' } })).body.id as string;
    await fn(h, model, session);
  } finally {
    await h.close();
    await model.close();
  }
}

const agent = async (h: Harness, session: string, body: Body) => {
  const res = await h.call<Body>('POST', `/api/v1/sessions/${session}/agents`, { body });
  expect(res.status, res.text).to.equal(201);
  return res.body;
};

const task = async (h: Harness, session: string, body: Body) => {
  const res = await h.call<Body>('POST', `/api/v1/sessions/${session}/tasks`, { body });
  expect(res.status, res.text).to.equal(201);
  return res.body;
};

const sessionWhen = (h: Harness, session: string, test: (s: Body) => boolean, what: string) =>
  eventually(async () => {
    const s = (await h.call<Body>('GET', `/api/v1/sessions/${session}`)).body;
    return test(s) ? s : null;
  }, what);

const text = (s: string) => [{ type: 'text', text: s }];

describe('agents of a session', function () {
  this.timeout(30_000);

  it('sums what every attempt of a task’s run used, a failed attempt’s tokens and steps included', async () => {
    // attempt 1: a turn with a tool call, then the endpoint refuses (400) and the attempt fails; attempt 2 answers
    const script: ScriptedTurn[] = [{ tool_calls: [{ name: 'message', args: { text: 'one' } }] }, { status: 400 }, { content: 'Done.' }];
    await withAgents(script, async (h, _model, session) => {
      const worker = await agent(h, session, { name: 'worker', tool_allowlist: ['message'] });
      await task(h, session, { id: 'retried', goal: 'say one', agent_id: worker.id, max_attempts: 2 });
      const done = await sessionWhen(h, session, (s) => s.outcome !== null, 'the task to end');
      const t = done.tasks[0];
      expect(t.status, JSON.stringify(t.output)).to.equal('succeeded');
      expect((await finishedRun(h, t.run_ids[0])).attempts).to.have.length(1);
      // two model calls of 10 prompt tokens each (one per attempt), and the first attempt's tool call
      expect(t.output.usage).to.deep.include({ steps: 1, model_turns: 2, prompt_tokens: 20, completion_tokens: 10 });
      expect(done.usage).to.deep.equal({ prompt_tokens: 20, completion_tokens: 10 });
    });
  });

  it('calls the agent’s own model, and reads a message injected while it runs before its next model call', async () => {
    let release!: () => void;
    const gate = new Promise<void>((r) => (release = r));
    const script: ScriptedTurn[] = [{ gate, tool_calls: [{ name: 'list_files', args: {} }] }, { content: 'Done; the changelog is noted.' }];
    await withAgents(script, async (h, model, session) => {
      const writer = await agent(h, session, { name: 'writer', tool_allowlist: ['list_files'], model: 'special-model' });
      await task(h, session, { id: 'write', goal: 'Write the release notes', agent_id: writer.id });
      await eventually(() => model.requests.length === 1, 'the first model call');
      // while the agent waits for its model, a person writes to it, and someone else writes to another agent
      const other = await agent(h, session, { name: 'other' });
      for (const body of [
        { role: 'user', to: writer.id, parts: text('Also update the changelog.') },
        { role: 'user', to: other.id, parts: text('Not for the writer.') },
      ])
        expect((await h.call('POST', `/api/v1/sessions/${session}/messages`, { body })).status).to.equal(201);
      // more than a page of messages to the other agent, then one more to the writer: read before its next call too
      // (one page of 200 was read a turn, and the task answered before the next)
      for (let i = 0; i < 210; i++)
        await h.rt.engine.sessions.postMessage('tenant-a', session, { role: 'user', to: other.id, parts: [{ type: 'text', text: `other ${i}` }] });
      expect(
        (await h.call('POST', `/api/v1/sessions/${session}/messages`, { body: { role: 'user', to: writer.id, parts: text('IMPORTANT: stop') } })).status,
      ).to.equal(201);
      release();
      const done = await sessionWhen(h, session, (s) => s.outcome !== null, 'the task to end');
      expect(done.outcome).to.equal('succeeded');
      expect(model.requests.map((r) => r.body.model)).to.deep.equal(['special-model', 'special-model']);
      const first = JSON.stringify(model.requests[0]!.body.messages);
      const second = JSON.stringify(model.requests[1]!.body.messages);
      expect(first).not.to.contain('changelog');
      expect(second).to.contain('Message from user to you: Also update the changelog.');
      expect(second).to.contain('Message from user to you: IMPORTANT: stop');
      expect(second).not.to.contain('Not for the writer.');
      const run = await finishedRun(h, done.tasks[0].run_ids[0]);
      expect(run.agent).to.deep.equal({ id: writer.id, name: 'writer', role: null, model: 'special-model' });
    });
  });

  it('reads a message posted while the model gives its last answer before taking that answer as the last word', async () => {
    let release!: () => void;
    const gate = new Promise<void>((r) => (release = r));
    const script: ScriptedTurn[] = [{ gate, content: 'All done.' }, { content: 'Stopped: not shipping.' }];
    await withAgents(script, async (h, model, session) => {
      const worker = await agent(h, session, { name: 'worker', tool_allowlist: ['list_files'] });
      await task(h, session, { id: 'ship', goal: 'Do it', agent_id: worker.id });
      await eventually(() => model.requests.length === 1, 'the model call');
      const posted = await h.call('POST', `/api/v1/sessions/${session}/messages`, { body: { role: 'user', to: worker.id, parts: text('STOP: do not ship') } });
      expect(posted.status).to.equal(201);
      release();
      const done = await sessionWhen(h, session, (s) => s.outcome !== null, 'the task to end');
      expect(done.outcome).to.equal('succeeded');
      expect(model.requests).to.have.length(2);
      expect(JSON.stringify(model.requests[1]!.body.messages)).to.contain('STOP: do not ship').and.contain('All done.');
      expect(done.tasks[0].output.summary ?? JSON.stringify(done.tasks[0].output)).to.contain('Stopped: not shipping.');
    });
  });

  it('refuses a tool call whose arguments are over a plan step’s 1 MB: the tool is not called, and the model is told', async () => {
    const script: ScriptedTurn[] = [{ tool_calls: [{ name: 'list_files', args: { path: 'x'.repeat(2 * 1024 * 1024) } }] }, { content: 'Gave up.' }];
    await withAgents(script, async (h, model, session) => {
      const worker = await agent(h, session, { name: 'worker', tool_allowlist: ['list_files'] });
      await task(h, session, { id: 'big', goal: 'List', agent_id: worker.id });
      const done = await sessionWhen(h, session, (s) => s.outcome !== null, 'the task to end');
      const run = await finishedRun(h, done.tasks[0].run_ids[0]);
      expect(run.steps[0]).to.deep.include({ tool: 'list_files', status: 'failed' });
      expect(run.steps[0].error.code).to.equal('args-too-large');
      expect(JSON.stringify(run.steps[0].args).length).to.be.below(4096);
      expect(JSON.stringify(model.requests[1]!.body.messages)).to.contain('args-too-large');
    });
  });

  it('refuses a model answer over 16 MB without holding it whole, saying so', async () => {
    const script: ScriptedTurn[] = [{ content: 'x'.repeat(17 * 1024 * 1024) }];
    await withAgents(script, async (h, model, session) => {
      const worker = await agent(h, session, { name: 'worker', tool_allowlist: ['list_files'] });
      await task(h, session, { id: 'huge', goal: 'Answer', agent_id: worker.id });
      const done = await sessionWhen(h, session, (s) => s.outcome !== null, 'the task to end');
      const run = await finishedRun(h, done.tasks[0].run_ids[0]);
      expect(run.error).to.deep.include({ code: 'agent-protocol' });
      expect(run.error.message).to.contain("the model endpoint's answer is over 16 MB");
      // not asked again within an attempt: one request an attempt (the task's two)
      expect(model.requests).to.have.length(run.attempt);
    });
  });

  it('continues a task only past the question its answer answers: an answer read before the task asked again does not answer the new question', async () => {
    const script: ScriptedTurn[] = [
      { tool_calls: [{ name: 'ask_for_input', args: { question: 'Deploy?' } }] },
      { tool_calls: [{ name: 'ask_for_input', args: { question: 'Really deploy to prod?' } }] },
      { content: 'Deployed to prod.' },
    ];
    await withAgents(script, async (h, model, session) => {
      const deployer = await agent(h, session, { name: 'deployer', tool_allowlist: ['read_file'] });
      await task(h, session, { id: 'deploy', goal: 'Deploy', agent_id: deployer.id });
      await sessionWhen(h, session, (s) => s.tasks[0].status === 'input_required', 'the first question');
      // answer B reads the tasks (the first question waiting) and is slow to go on; answer A continues the task,
      // whose next run reads both and asks again
      const tasks = h.rt.store.tasks;
      // an answer reads the waiting tasks alone
      const list = tasks.listIn.bind(tasks);
      let held = false;
      let reached!: () => void;
      const holding = new Promise<void>((r) => (reached = r));
      tasks.listIn = async (...args) => {
        const found = await list(...args);
        if (!held) {
          held = true;
          reached();
          await new Promise((r) => setTimeout(r, 2500));
        }
        return found;
      };
      try {
        const slow = h.call('POST', `/api/v1/sessions/${session}/messages`, { body: { role: 'user', parts: text('Yes (B).') } });
        // A is posted only once B has read the tasks: under load B's request can take longer than any fixed pause
        // to get there, and A would then be the one held (B continues the task, and A answers its next question)
        await holding;
        expect((await h.call('POST', `/api/v1/sessions/${session}/messages`, { body: { role: 'user', parts: text('Yes (A).') } })).status).to.equal(201);
        await sessionWhen(h, session, (s) => s.tasks[0].status === 'input_required' && s.tasks[0].run_ids.length === 2, 'the second question');
        expect((await slow).status).to.equal(201);
      } finally {
        tasks.listIn = list;
      }
      await new Promise((r) => setTimeout(r, 500));
      const after = (await h.call<Body>('GET', `/api/v1/sessions/${session}`)).body.tasks[0];
      expect(after.status, 'the second question still waits for its own answer').to.equal('input_required');
      expect(after.run_ids).to.have.length(2);
      expect(model.requests).to.have.length(2);
    });
  });

  it('gives the run that continues a task what is left of its agent’s steps, none when they are spent', async () => {
    const script: ScriptedTurn[] = [
      { tool_calls: [{ name: 'list_files', args: {} }] },
      { tool_calls: [{ name: 'ask_for_input', args: { question: 'Go on?' } }] },
      { tool_calls: [{ name: 'list_files', args: {} }] },
      { content: 'Done.' },
    ];
    await withAgents(script, async (h, _model, session) => {
      const lister = await agent(h, session, { name: 'lister', tool_allowlist: ['list_files'], budget: { seconds: 60, max_steps: 1 } });
      await task(h, session, { id: 'list', goal: 'List', agent_id: lister.id, max_attempts: 1 });
      const waiting = await sessionWhen(h, session, (s) => s.tasks[0].status === 'input_required', 'the question');
      const question = (await h.call<Body>('GET', `/api/v1/sessions/${session}/messages`)).body.data.find((m: Body) => m.kind === 'input_request');
      expect(waiting.tasks[0].output.usage.steps).to.equal(1);
      await h.call('POST', `/api/v1/sessions/${session}/messages`, { body: { role: 'user', in_reply_to: question.id, parts: text('Yes.') } });
      const done = await sessionWhen(h, session, (s) => s.outcome !== null, 'the task to end');
      // its one step was spent: the continuation had none, and its tool call ended the task (it was given one more)
      const next = await finishedRun(h, done.tasks[0].run_ids[1]);
      expect(next.budget.max_steps).to.equal(0);
      expect(next.error.code).to.equal('max-steps-reached');
      expect(done.tasks[0].status).to.equal('failed');
      expect(done.tasks[0].output.usage.steps).to.equal(1);
    });
  });

  it('lets an agent of max_steps 0 answer, from a goal or from a plan’s agent step, and changes a budget to 0 as it sets one', async () => {
    await withAgents([{ content: 'Answered.' }], async (h, model, session) => {
      const quiet = await agent(h, session, { name: 'quiet', tool_allowlist: ['list_files', 'agent'], budget: { seconds: 60, max_steps: 0 } });
      await task(h, session, { id: 'goal', goal: 'Answer', agent_id: quiet.id });
      await task(h, session, { id: 'plan', steps: [{ tool: 'agent', args: { goal: 'Answer' } }], agent_id: quiet.id });
      const done = await sessionWhen(h, session, (s) => s.outcome !== null, 'both tasks to end');
      expect(done.tasks.map((t: Body) => [t.id, t.status])).to.deep.equal([
        ['goal', 'succeeded'],
        ['plan', 'succeeded'],
      ]);
      expect(model.requests).to.have.length(2);
      const edited = await h.call<Body>('PATCH', `/api/v1/sessions/${session}/agents/${quiet.id}`, { body: { budget: { max_steps: 0, seconds: 30 } } });
      expect(edited.status, edited.text).to.equal(200);
      expect(edited.body.budget).to.deep.equal({ seconds: 30, max_steps: 0 });
    });
  });

  it('gives a plan’s agent step of a task with no agent the messages to all posted since the task was added, not the log before it', async () => {
    await withAgents([{ content: 'Noted.' }], async (h, model, session) => {
      const old = await h.call<Body>('POST', `/api/v1/sessions/${session}/messages`, { body: { role: 'user', parts: text('OLD BROADCAST before the task') } });
      expect(old.status, old.text).to.equal(201);
      await task(h, session, { id: 'plan', steps: [{ tool: 'agent', args: { goal: 'List the notes' } }] });
      const done = await sessionWhen(h, session, (s) => s.outcome !== null, 'the task to end');
      expect(done.tasks[0].status, JSON.stringify(done.tasks[0].output)).to.equal('succeeded');
      expect(model.requests).to.have.length(1);
      expect(JSON.stringify(model.requests[0]!.body.messages)).to.contain('List the notes').and.not.contain('OLD BROADCAST');
    });
  });

  it('keeps in a continued task’s output the steps of its run before the question too, and hands them to its dependents', async () => {
    const script: ScriptedTurn[] = [
      { tool_calls: [{ name: 'list_files', args: {} }] },
      { tool_calls: [{ name: 'ask_for_input', args: { question: 'Which one?' } }] },
      { content: 'Done with the first.' },
    ];
    await withAgents(script, async (h, _model, session) => {
      const lister = await agent(h, session, { name: 'lister', tool_allowlist: ['list_files'] });
      await task(h, session, { id: 'look', goal: 'Look around', agent_id: lister.id });
      await task(h, session, { id: 'after', depends_on: ['look'], steps: [{ tool: 'message', args: { text: '${inputs.upstream.look.steps.0.tool}' } }] });
      const waiting = await sessionWhen(h, session, (s) => s.tasks[0].status === 'input_required', 'the task to ask');
      const question = (await h.call<Body>('GET', `/api/v1/sessions/${session}/messages`)).body.data.find((m: Body) => m.kind === 'input_request');
      expect(waiting.tasks[0].run_ids).to.have.length(1);
      const answered = await h.call('POST', `/api/v1/sessions/${session}/messages`, {
        body: { role: 'user', in_reply_to: question.id, to: lister.id, parts: text('The first.') },
      });
      expect(answered.status).to.equal(201);
      const done = await sessionWhen(h, session, (s) => s.outcome !== null, 'both tasks to end');
      expect(done.outcome).to.equal('succeeded');
      // with their outputs whole (the detail has their summaries)
      const [look, after] = (await h.call<Body>('GET', `/api/v1/sessions/${session}/tasks`)).body.data;
      expect(done.tasks.map((t: Body) => t.id)).to.deep.equal([look.id, after.id]);
      expect(look.run_ids).to.have.length(2);
      expect(look.output.steps.map((st: Body) => st.tool)).to.deep.equal(['list_files']);
      expect(look.output.result.final_answer).to.equal('Done with the first.');
      expect(after.output.steps[0].output.text).to.equal('list_files');
    });
  });

  it('asks for input: the run ends and holds no worker, the task waits, and the answer continues the conversation in the task’s next run', async () => {
    const script: ScriptedTurn[] = [
      { content: 'I need to know where.', tool_calls: [{ name: 'ask_for_input', args: { question: 'Which branch should I deploy?' } }] },
      { content: 'Deployed to main.' },
    ];
    await withAgents(script, async (h, model, session) => {
      const deployer = await agent(h, session, { name: 'deployer', tool_allowlist: ['read_file'] });
      await task(h, session, { id: 'deploy', goal: 'Deploy the service', agent_id: deployer.id });
      // the task's move and the session's status that follows it are two writes: the session follows a moment later
      const waiting = await sessionWhen(
        h,
        session,
        (s) => s.tasks[0].status === 'input_required' && s.status === 'waiting',
        'the task and its session to wait',
      );
      expect(waiting.outcome).to.equal(null);
      const asked = await finishedRun(h, waiting.tasks[0].run_ids[0]);
      expect(asked.status).to.equal('succeeded');
      expect(asked.summary).to.equal('waiting for input: Which branch should I deploy?');
      expect(asked.result.input_required.question).to.equal('Which branch should I deploy?');
      expect(asked.trigger).to.deep.include({ type: 'task', task_id: 'deploy', prior_attempts: 0 });
      // nothing of it is running: no job is active and no tenant slot is held (once its job has left the
      // worker, a moment after the task moved), while the task still waits
      await eventually(async () => (await h.rt.queues.get('runs').getActiveCount()) === 0, 'the run’s job to leave the worker');
      expect((await h.rt.engine.runs.reliabilityContext('tenant-a')).tenant.running).to.equal(0);
      expect((await h.call<Body>('GET', `/api/v1/sessions/${session}`)).body.tasks[0].status).to.equal('input_required');
      // the question is in the session's log, from the agent
      const log = (await h.call<Body>('GET', `/api/v1/sessions/${session}/messages`)).body.data;
      const question = log.find((m: Body) => m.kind === 'input_request');
      expect(question).to.deep.include({ role: 'agent', from: deployer.id, task_id: 'deploy', run_id: asked.id });
      expect(question.parts[0].text).to.equal('Which branch should I deploy?');

      const answer = await h.call('POST', `/api/v1/sessions/${session}/messages`, {
        body: { role: 'user', in_reply_to: question.id, to: deployer.id, parts: text('Deploy main.') },
      });
      expect(answer.status).to.equal(201);
      const done = await sessionWhen(h, session, (s) => s.outcome !== null, 'the task to end');
      expect(done.outcome).to.equal('succeeded');
      expect(done.status).to.equal('idle');
      // the answered task is queued again: its session runs again, and goes idle when it ends
      const statuses = (await h.rt.events.after(`session:${session}`, '0-0'))
        .filter((e) => e.type === 'session.updated')
        .map((e) => (e.data as Body).status as string);
      expect(statuses.slice(statuses.lastIndexOf('waiting'))).to.deep.equal(['waiting', 'running', 'idle']);
      const t = done.tasks[0];
      expect(t.status).to.equal('succeeded');
      expect(t.run_ids).to.have.length(2);
      expect(t.attempts).to.equal(2);
      const whole = (await h.call<Body>('GET', `/api/v1/sessions/${session}/tasks`)).body.data[0];
      expect(whole.output.result.final_answer).to.equal('Deployed to main.');
      // the tokens of both runs: two model calls of 10 prompt tokens each
      expect(t.output.usage).to.deep.include({ model_turns: 2, prompt_tokens: 20, completion_tokens: 10 });
      expect(done.usage).to.deep.equal({ prompt_tokens: 20, completion_tokens: 10 });
      const next = await finishedRun(h, t.run_ids[1]);
      expect(next.trigger).to.deep.include({ type: 'task', task_id: 'deploy', prior_attempts: 1, continues: asked.id });
      // asking for input is not a failed try: the continuation keeps both of the task's max_attempts
      expect(next.retry).to.deep.include({ attempts: 2 });
      // the second call continues the first conversation, with the answer after the question
      expect(model.requests).to.have.length(2);
      const messages = model.requests[1]!.body.messages as Body[];
      expect(messages[0]!.role).to.equal('system');
      expect(messages.find((m) => m.role === 'assistant')!.tool_calls[0].function.name).to.equal('ask_for_input');
      expect(messages.at(-1)).to.deep.equal({ role: 'user', content: 'Message from user to you (a reply to your message): Deploy main.' });
      // each attempt of the task has its own deterministic job
      const queue = h.rt.queues.get('runs');
      // (a run ends in the store before its job's processor returns: the job completes a moment later)
      for (const attempt of [1, 2]) {
        await eventually(
          async () => (await (await queue.getJob(`${session}__deploy__${attempt}`))?.getState()) === 'completed',
          `attempt ${attempt}’s job to complete`,
        );
      }
      // the session's trace told the story
      const types = (await h.rt.events.after(`session:${session}`, '0-0')).map((e) => (e.type === 'task.updated' ? `task:${(e.data as Body).status}` : e.type));
      expect(types.filter((x) => x.startsWith('task:'))).to.deep.equal([
        'task:pending',
        'task:queued',
        'task:running',
        'task:input_required',
        'task:queued',
        'task:running',
        'task:succeeded',
      ]);
    });
  });

  it('cuts a question longer than a message may be to the limit, marked, and waits for its answer', async () => {
    const long = 'q'.repeat(100_001);
    await withAgents([{ tool_calls: [{ name: 'ask_for_input', args: { question: long } }] }], async (h, _model, session) => {
      const asker = await agent(h, session, { name: 'asker' });
      await task(h, session, { id: 'ask', goal: 'Ask at length', agent_id: asker.id });
      const waiting = await sessionWhen(
        h,
        session,
        (s) => s.tasks[0].status !== 'pending' && s.tasks[0].status !== 'queued' && s.tasks[0].status !== 'running',
        'the task to wait',
      );
      expect(waiting.tasks[0].status).to.equal('input_required');
      const log = (await h.call<Body>('GET', `/api/v1/sessions/${session}/messages`)).body.data;
      const question = log.find((m: Body) => m.kind === 'input_request').parts[0].text as string;
      expect(question).to.have.length(100_000);
      expect(question.endsWith('…(truncated)')).to.equal(true);
      expect((await finishedRun(h, waiting.tasks[0].run_ids[0])).result.input_required.question).to.equal(question);
    });
  });

  it('does not offer a plan’s agent step ask_for_input, and starts its inbox at the task’s add', async () => {
    await withAgents([{ content: 'Done.' }], async (h, model, session) => {
      const planner = await agent(h, session, { name: 'planner', tool_allowlist: ['agent', 'list_files'] });
      const early = await h.call('POST', `/api/v1/sessions/${session}/messages`, { body: { role: 'user', to: planner.id, parts: text('Before the task.') } });
      expect(early.status).to.equal(201);
      await task(h, session, { id: 'plan', steps: [{ tool: 'agent', args: { goal: 'List the files' } }], agent_id: planner.id });
      const done = await sessionWhen(h, session, (s) => s.outcome !== null, 'the task to end');
      expect(done.tasks[0].status).to.equal('succeeded');
      expect(model.requests).to.have.length(1);
      // a plan cannot pause: a question would go to the log while the task went on, its answer doing nothing
      expect(model.requests[0]!.body.tools.map((t: Body) => t.function.name)).not.to.include('ask_for_input');
      expect(JSON.stringify(model.requests[0]!.body.messages)).not.to.contain('Before the task.');
    });
  });

  it('edits an agent: a run already made keeps its snapshot, the next run takes the edit; an archived session’s agents are read-only', async () => {
    const script: ScriptedTurn[] = [{ content: 'First done.' }, { content: 'Second done.' }];
    await withAgents(script, async (h, model, session) => {
      const writer = await agent(h, session, { name: 'writer', instructions: 'Be brief.', budget: { seconds: 60 } });
      await task(h, session, { id: 'first', goal: 'Write one line', agent_id: writer.id });
      const first = await sessionWhen(h, session, (s) => s.tasks[0].status === 'succeeded', 'the first task');
      const edited = await h.call<Body>('PATCH', `/api/v1/sessions/${session}/agents/${writer.id}`, {
        body: { instructions: 'Be thorough.', budget: { seconds: 120 }, model: 'bigger-model' },
      });
      expect(edited.status, edited.text).to.equal(200);
      expect(edited.body).to.deep.include({ name: 'writer', instructions: 'Be thorough.', budget: { seconds: 120 }, model: 'bigger-model' });
      expect((await h.call<Body>('GET', `/api/v1/sessions/${session}/agents/${writer.id}`)).body).to.deep.equal(edited.body);
      // the first run's snapshot is as it was
      const before = await finishedRun(h, first.tasks[0].run_ids[0]);
      expect(before.budget.seconds).to.equal(60);
      expect(before.goal).to.contain('Be brief.');
      expect(before.agent).to.deep.include({ id: writer.id, model: null });
      // a task made after the edit runs with it
      await task(h, session, { id: 'second', goal: 'Write another', agent_id: writer.id });
      const both = await sessionWhen(h, session, (s) => s.tasks.every((t: Body) => t.status === 'succeeded'), 'the second task');
      const after = await finishedRun(h, both.tasks.find((t: Body) => t.id === 'second').run_ids[0]);
      expect(after.budget.seconds).to.equal(120);
      expect(after.goal).to.contain('Be thorough.');
      expect(model.requests.at(-1)!.body.model).to.equal('bigger-model');
      expect(model.requests[0]!.body.model).to.equal('default-model');
      // two edits of different budget members at once both land, though each read the agent before either wrote
      const release = heldTogether(h.rt.store.agents, 'get', 2);
      try {
        const both = await Promise.all([
          h.call('PATCH', `/api/v1/sessions/${session}/agents/${writer.id}`, { body: { budget: { seconds: 150 } } }),
          h.call('PATCH', `/api/v1/sessions/${session}/agents/${writer.id}`, { body: { budget: { max_steps: 7 } } }),
        ]);
        expect(both.map((r) => r.status)).to.deep.equal([200, 200]);
      } finally {
        release();
      }
      expect((await h.call<Body>('GET', `/api/v1/sessions/${session}/agents/${writer.id}`)).body.budget).to.deep.equal({ seconds: 150, max_steps: 7 });
      // not another session's agent, nor once archived
      const other = (await h.call<Body>('POST', '/api/v1/sessions', { body: { title: 'other' } })).body.id;
      expect((await h.call('GET', `/api/v1/sessions/${other}/agents/${writer.id}`)).status).to.equal(404);
      expect((await h.call('PATCH', `/api/v1/sessions/${other}/agents/${writer.id}`, { body: { name: 'x' } })).status).to.equal(404);
      expect((await h.call('PATCH', `/api/v1/sessions/${session}/agents/${writer.id}`, { body: {} })).status).to.equal(400);
      // a budget over the operator's maximum is refused, as a run's or an automation's is, not cut down
      const tooLong = { budget: { seconds: h.config.runBudget.maxSeconds + 1 } };
      for (const [method, url] of [
        ['POST', `/api/v1/sessions/${session}/agents`],
        ['PATCH', `/api/v1/sessions/${session}/agents/${writer.id}`],
      ] as const) {
        const refused = await h.call<Body>(method, url, { body: method === 'POST' ? { name: 'long', ...tooLong } : tooLong });
        expect(refused.status, refused.text).to.equal(400);
        expect(refused.body.errors[0]).to.deep.include({ path: '/body/budget/seconds' });
      }
      expect((await h.call<Body>('GET', `/api/v1/sessions/${session}/agents`)).body.data.map((a: Body) => a.name)).to.deep.equal(['writer']);
      expect((await h.call<Body>('GET', `/api/v1/sessions/${session}/agents/${writer.id}`)).body.budget.seconds).to.equal(150);
      await h.call('DELETE', `/api/v1/sessions/${session}`);
      expect((await h.call('PATCH', `/api/v1/sessions/${session}/agents/${writer.id}`, { body: { name: 'x' } })).status).to.equal(409);
    });
  });

  it('lets an agent’s step message another agent of its session, by id or by a name one agent has, in the durable log', async () => {
    await withAgents([{ content: 'unused' }], async (h, _model, session) => {
      const writer = await agent(h, session, { name: 'writer', tool_allowlist: ['message'] });
      const reviewer = await agent(h, session, { name: 'reviewer' });
      // two agents of one name, and one named after the reviewer's id: a name two agents have names neither,
      // and an id is the agent's whatever another is named
      for (const name of ['twin', 'twin', reviewer.id]) await agent(h, session, { name });
      await task(h, session, {
        tasks: [
          { id: 'ask', agent_id: writer.id, steps: [{ tool: 'message', args: { to: 'reviewer', text: 'Please review PR 7.' } }] },
          { id: 'nobody', agent_id: writer.id, steps: [{ tool: 'message', args: { to: 'ghost', text: 'hello?' } }] },
          { id: 'twins', agent_id: writer.id, steps: [{ tool: 'message', args: { to: 'twin', text: 'which of you?' } }] },
          { id: 'by-id', agent_id: writer.id, depends_on: ['ask'], steps: [{ tool: 'message', args: { to: reviewer.id, text: 'Merged.' } }] },
        ],
      });
      const done = await sessionWhen(h, session, (s) => s.outcome !== null, 'every task to end');
      expect(done.tasks.map((t: Body) => [t.id, t.status])).to.deep.equal([
        ['ask', 'succeeded'],
        ['nobody', 'failed'],
        ['twins', 'failed'],
        ['by-id', 'succeeded'],
      ]);
      const failed = await finishedRun(h, done.tasks[1].run_ids.at(-1));
      expect(failed.steps[0].error.code).to.equal('invalid-args');
      expect(failed.steps[0].error.message).to.contain('no agent ghost');
      const twins = await finishedRun(h, done.tasks[2].run_ids.at(-1));
      expect(twins.steps[0].error.code).to.equal('invalid-args');
      expect(twins.steps[0].error.message).to.contain('2 agents of this session are named twin');
      const log = (await h.call<Body>('GET', `/api/v1/sessions/${session}/messages`)).body.data;
      expect(log).to.have.length(2);
      expect(log[0]).to.deep.include({ role: 'agent', from: writer.id, to: reviewer.id, task_id: 'ask', kind: 'text' });
      expect(log[0].parts).to.deep.equal(text('Please review PR 7.'));
      expect(log[1]).to.deep.include({ to: reviewer.id, task_id: 'by-id' });
    });
  });

  it('takes a message whose to and in_reply_to are null as one to all that replies to nothing, as the log shows them', async () => {
    await withAgents([{ content: 'unused' }], async (h, _model, session) => {
      const res = await h.call<Body>('POST', `/api/v1/sessions/${session}/messages`, {
        body: { role: 'user', to: null, in_reply_to: null, parts: text('To everyone.') },
      });
      expect(res.status, res.text).to.equal(201);
      expect(res.body).to.deep.include({ to: null, in_reply_to: null });
      const bad = await h.call<Body>('POST', `/api/v1/sessions/${session}/messages`, { body: { role: 'user', to: 'someone', parts: text('x') } });
      expect(bad.status).to.equal(400);
    });
  });

  it('delivers a message to an agent whose task starts later, and one posted while it asks (which also answers it)', async () => {
    let release!: () => void;
    const gate = new Promise<void>((r) => (release = r));
    const script: ScriptedTurn[] = [
      { content: 'Reviewed PR 7.' },
      { gate, tool_calls: [{ name: 'ask_for_input', args: { question: 'Which branch?' } }] },
      { content: 'Deployed release-9.' },
    ];
    await withAgents(script, async (h, model, session) => {
      const writer = await agent(h, session, { name: 'writer', tool_allowlist: ['message'] });
      const reviewer = await agent(h, session, { name: 'reviewer', tool_allowlist: ['read_file'] });
      const deployer = await agent(h, session, { name: 'deployer', tool_allowlist: ['read_file'] });
      await task(h, session, {
        tasks: [
          { id: 'write', agent_id: writer.id, steps: [{ tool: 'message', args: { to: 'reviewer', text: 'Please review PR 7.' } }] },
          { id: 'between', steps: [{ tool: 'list_files', args: {} }], depends_on: ['write'] },
          { id: 'review', agent_id: reviewer.id, goal: 'Review what you are asked to', depends_on: ['between'] },
          { id: 'deploy', agent_id: deployer.id, goal: 'Deploy', depends_on: ['review'] },
        ],
      });
      // the writer's message was posted long before the reviewer's task started: it is in the reviewer's first call
      await eventually(() => model.requests.length === 2, 'the deployer’s first model call');
      expect(JSON.stringify(model.requests[0]!.body.messages)).to.contain('Message from agent writer to you: Please review PR 7.');
      // the person says which branch while the deployer's model is still thinking (before it asks)
      const early = await h.call('POST', `/api/v1/sessions/${session}/messages`, { body: { role: 'user', to: deployer.id, parts: text('Use release-9.') } });
      expect(early.status).to.equal(201);
      release();
      const done = await sessionWhen(h, session, (s) => s.outcome !== null, 'the session to end');
      expect(done.outcome).to.equal('succeeded');
      // that message answered the question without a second one, and reached the run that continued
      expect(done.tasks.find((t: Body) => t.id === 'deploy').run_ids).to.have.length(2);
      expect(model.requests).to.have.length(3);
      expect(JSON.stringify(model.requests[2]!.body.messages)).to.contain('Use release-9.');
    });
  });

  it('never lets an agent answer its own question, nor another agent’s broadcast', async () => {
    const script: ScriptedTurn[] = [{ tool_calls: [{ name: 'ask_for_input', args: { question: 'May I deploy to prod?' } }] }, { content: 'Deployed.' }];
    await withAgents(script, async (h, model, session) => {
      const deployer = await agent(h, session, { name: 'deployer', tool_allowlist: ['session', 'message'] });
      const chatty = await agent(h, session, { name: 'chatty', tool_allowlist: ['message'] });
      await task(h, session, { id: 'deploy', goal: 'Deploy', agent_id: deployer.id });
      await sessionWhen(h, session, (s) => s.tasks[0].status === 'input_required', 'the task to wait');
      await task(h, session, {
        tasks: [
          // the same agent says yes to itself through the session tool: in its own session it speaks as itself
          {
            id: 'self',
            agent_id: deployer.id,
            steps: [{ tool: 'session', args: { action: 'post_message', session_id: session, message: { text: 'Yes, deploy.' } } }],
          },
          // another agent's message to everyone is not an answer either
          { id: 'noise', agent_id: chatty.id, steps: [{ tool: 'message', args: { text: 'Build is green.' } }] },
        ],
      });
      // the session's status is written after its tasks' (its recount follows each task's end): read once it has moved on
      const s = await sessionWhen(
        h,
        session,
        (x) => x.tasks.filter((t: Body) => t.status === 'succeeded').length === 2 && x.status !== 'running',
        'the two posts, and the session after them',
      );
      const log = (await h.call<Body>('GET', `/api/v1/sessions/${session}/messages`)).body.data;
      expect(log.find((m: Body) => m.parts[0].text === 'Yes, deploy.')).to.deep.include({ role: 'agent', from: deployer.id });
      await new Promise((r) => setTimeout(r, 300));
      expect((await h.call<Body>('GET', `/api/v1/sessions/${session}/tasks`)).body.data[0].status).to.equal('input_required');
      expect(s.status).to.equal('waiting');
      expect(model.requests).to.have.length(1);
    });
  });

  it('takes a reply to one task’s question as that task’s answer only: another agent waiting is not answered, nor told it', async () => {
    const ask = (question: string): ScriptedTurn => ({ tool_calls: [{ name: 'ask_for_input', args: { question } }] });
    const script: ScriptedTurn[] = [ask('Deploy staging?'), ask('Wipe prod?'), { content: 'Done.' }, { content: 'Done.' }];
    await withAgents(script, async (h, model, session) => {
      const staging = await agent(h, session, { name: 'staging' });
      const prod = await agent(h, session, { name: 'prod' });
      await task(h, session, {
        tasks: [
          { id: 'a', goal: 'deploy staging', agent_id: staging.id },
          { id: 'b', goal: 'wipe prod', agent_id: prod.id },
        ],
      });
      await sessionWhen(h, session, (s) => s.tasks.every((t: Body) => t.status === 'input_required'), 'both tasks to wait');
      const log = (await h.call<Body>('GET', `/api/v1/sessions/${session}/messages`)).body.data as Body[];
      const questionOf = (task: string) => log.find((m) => m.kind === 'input_request' && m.task_id === task)!;
      // a reply to staging's question, to no one in particular
      const reply = await h.call('POST', `/api/v1/sessions/${session}/messages`, {
        body: { role: 'user', in_reply_to: questionOf('a').id, parts: text('yes, staging') },
      });
      expect(reply.status).to.equal(201);
      await sessionWhen(h, session, (s) => s.tasks.find((t: Body) => t.id === 'a').status === 'succeeded', 'staging’s task to end');
      await new Promise((r) => setTimeout(r, 300));
      expect((await h.call<Body>('GET', `/api/v1/sessions/${session}`)).body.tasks.find((t: Body) => t.id === 'b').status).to.equal('input_required');
      expect(model.requests).to.have.length(3);
      expect(JSON.stringify(model.requests[2]!.body.messages)).to.contain('(a reply to your message): yes, staging');
      // prod's own answer continues it, and its conversation does not hold the reply meant for staging
      await h.call('POST', `/api/v1/sessions/${session}/messages`, { body: { role: 'user', in_reply_to: questionOf('b').id, parts: text('no, never') } });
      const done = await sessionWhen(h, session, (s) => s.outcome !== null, 'the session to end');
      expect(done.tasks.map((t: Body) => t.run_ids.length)).to.deep.equal([2, 2]);
      const prodCall = JSON.stringify(model.requests[3]!.body.messages);
      expect(prodCall).to.contain('no, never').and.not.contain('yes, staging');
    });
  });

  it('takes a message to the agent that replies to its other message as an answer, and gives a reply to its question to it whoever it is addressed to', async () => {
    const script: ScriptedTurn[] = [
      { tool_calls: [{ name: 'message', args: { text: 'Starting on the deploy.' } }] },
      { tool_calls: [{ name: 'ask_for_input', args: { question: 'Which branch?' } }] },
      { tool_calls: [{ name: 'ask_for_input', args: { question: 'Which region?' } }] },
      { content: 'Deployed.' },
    ];
    await withAgents(script, async (h, model, session) => {
      const deployer = await agent(h, session, { name: 'deployer', tool_allowlist: ['message'] });
      const other = await agent(h, session, { name: 'other' });
      await task(h, session, { id: 'deploy', goal: 'Deploy', agent_id: deployer.id });
      await sessionWhen(h, session, (s) => s.tasks[0].status === 'input_required', 'the task to wait');
      const log = async () => (await h.call<Body>('GET', `/api/v1/sessions/${session}/messages`)).body.data as Body[];
      const status = (await log()).find((m) => m.kind === 'text' && m.from === deployer.id)!;
      // to the agent, replying to its status message (not a question): an answer
      const first = await h.call('POST', `/api/v1/sessions/${session}/messages`, {
        body: { role: 'user', to: deployer.id, in_reply_to: status.id, parts: text('use main') },
      });
      expect(first.status).to.equal(201);
      await eventually(() => model.requests.length === 3 || null, 'the continuation’s model call');
      expect(JSON.stringify(model.requests[2]!.body.messages)).to.contain('use main');
      await sessionWhen(h, session, (s) => s.tasks[0].status === 'input_required' && s.tasks[0].run_ids.length === 2, 'the second question');
      const second = (await log()).filter((m) => m.kind === 'input_request').at(-1)!;
      // a reply to the question, addressed to another agent: it answers the question, and its asker reads it
      await h.call('POST', `/api/v1/sessions/${session}/messages`, { body: { role: 'user', to: other.id, in_reply_to: second.id, parts: text('eu-west') } });
      const done = await sessionWhen(h, session, (s) => s.outcome !== null, 'the task to end');
      expect(done.tasks[0]).to.deep.include({ status: 'succeeded' });
      expect(JSON.stringify(model.requests[3]!.body.messages)).to.contain('eu-west');
    });
  });

  it('takes a person’s reply to all that replies to another agent’s message as that agent’s: a waiting agent is not answered by it', async () => {
    const script: ScriptedTurn[] = [{ tool_calls: [{ name: 'ask_for_input', args: { question: 'Which branch?' } }] }, { content: 'Done.' }];
    await withAgents(script, async (h, model, session) => {
      const asker = await agent(h, session, { name: 'asker' });
      const builder = await agent(h, session, { name: 'builder', tool_allowlist: ['message'] });
      await task(h, session, { id: 'ask', goal: 'Deploy', agent_id: asker.id });
      await sessionWhen(h, session, (s) => s.tasks[0].status === 'input_required', 'the task to wait');
      await task(h, session, { id: 'say', agent_id: builder.id, steps: [{ tool: 'message', args: { text: 'The build is green.' } }] });
      await sessionWhen(h, session, (s) => s.tasks.find((t: Body) => t.id === 'say')?.status === 'succeeded', 'the builder to speak');
      const said = ((await h.call<Body>('GET', `/api/v1/sessions/${session}/messages`)).body.data as Body[]).find((m) => m.from === builder.id)!;
      expect(
        (await h.call('POST', `/api/v1/sessions/${session}/messages`, { body: { role: 'user', in_reply_to: said.id, parts: text('Nice.') } })).status,
      ).to.equal(201);
      await new Promise((r) => setTimeout(r, 500));
      expect((await h.call<Body>('GET', `/api/v1/sessions/${session}`)).body.tasks.find((t: Body) => t.id === 'ask').status).to.equal('input_required');
      expect(model.requests).to.have.length(1);
    });
  });

  it('writes nothing in a session archived after a route checked it: a message, a new agent and an agent’s edit are refused with 409', async () => {
    await withAgents([{ content: 'unused' }], async (h, _model, session) => {
      const writer = await agent(h, session, { name: 'writer' });
      // each write is held until the archive has committed: the route's check saw the session live
      let archived!: Promise<unknown>;
      const store = h.rt.store;
      const held = <K extends 'append' | 'insert' | 'update'>(repo: Record<K, (...a: any[]) => Promise<any>>, name: K) => {
        const original = repo[name].bind(repo);
        repo[name] = async (...args: any[]) => {
          await archived;
          return original(...args);
        };
        return () => (repo[name] = original);
      };
      const restore = [held(store.messages, 'append'), held(store.agents, 'insert'), held(store.agents, 'update')];
      let answers: { status: number }[];
      try {
        let archive!: () => void;
        archived = new Promise<void>((r) => (archive = r));
        const writes = Promise.all([
          h.call('POST', `/api/v1/sessions/${session}/messages`, { body: { role: 'user', parts: text('too late') } }),
          h.call('POST', `/api/v1/sessions/${session}/agents`, { body: { name: 'late' } }),
          h.call('PATCH', `/api/v1/sessions/${session}/agents/${writer.id}`, { body: { name: 'renamed' } }),
        ]);
        // the three have passed their checks and wait at their writes
        await new Promise((r) => setTimeout(r, 200));
        expect((await h.call('DELETE', `/api/v1/sessions/${session}`)).status).to.equal(200);
        archive();
        answers = await writes;
      } finally {
        restore.forEach((r) => r());
      }
      expect(answers.map((r) => r.status)).to.deep.equal([409, 409, 409]);
      expect((await h.call<Body>('GET', `/api/v1/sessions/${session}/messages`)).body.data).to.deep.equal([]);
      expect((await h.call<Body>('GET', `/api/v1/sessions/${session}/agents`)).body.data.map((a: Body) => a.name)).to.deep.equal(['writer']);
    });
  });

  it('keeps at most SERVICE_SESSION_MAX_AGENTS agents a session: one more is a 409, also when creates race', async () => {
    const h = await startHarness({ workers: false, env: { SERVICE_SESSION_MAX_AGENTS: '2' } });
    try {
      const session = (await h.call<Body>('POST', '/api/v1/sessions', { body: { title: 'capped' } })).body.id as string;
      await agent(h, session, { name: 'one' });
      const raced = await Promise.all(['two', 'three', 'four'].map((name) => h.call<Body>('POST', `/api/v1/sessions/${session}/agents`, { body: { name } })));
      expect(raced.map((r) => r.status).sort()).to.deep.equal([201, 409, 409]);
      const refused = raced.find((r) => r.status === 409)!;
      expect(refused.body.detail).to.contain('SERVICE_SESSION_MAX_AGENTS');
      expect((await h.call<Body>('GET', `/api/v1/sessions/${session}/agents`)).body.data).to.have.length(2);
      // another session has its own
      const other = (await h.call<Body>('POST', '/api/v1/sessions', { body: { title: 'other' } })).body.id as string;
      await agent(h, other, { name: 'one' });
    } finally {
      await h.close();
    }
  });

  it('changes only the budget’s fields given: the others keep their values', async () => {
    await withAgents([{ content: 'unused' }], async (h, _model, session) => {
      const capped = await agent(h, session, { name: 'capped', budget: { seconds: 120, max_steps: 7 } });
      const patch = (budget: Body) => h.call<Body>('PATCH', `/api/v1/sessions/${session}/agents/${capped.id}`, { body: { budget } });
      expect((await patch({ max_steps: 3 })).body.budget).to.deep.equal({ seconds: 120, max_steps: 3 });
      expect((await patch({ seconds: 50 })).body.budget).to.deep.equal({ seconds: 50, max_steps: 3 });
      // null removes the bound on steps (RFC 7396), as an automation's budget patch does, sent as a merge patch too
      const merged = await h.call<Body>('PATCH', `/api/v1/sessions/${session}/agents/${capped.id}`, {
        raw: JSON.stringify({ budget: { max_steps: null } }),
        headers: { 'content-type': 'application/merge-patch+json' },
      });
      expect(merged.status, merged.text).to.equal(200);
      expect(merged.body.budget).to.deep.equal({ seconds: 50 });
    });
  });

  it('takes many answers at once as one continuation', async () => {
    const script: ScriptedTurn[] = [{ tool_calls: [{ name: 'ask_for_input', args: { question: 'Which branch?' } }] }, { content: 'Deployed.' }];
    await withAgents(script, async (h, model, session) => {
      const deployer = await agent(h, session, { name: 'deployer' });
      await task(h, session, { id: 'deploy', goal: 'Deploy', agent_id: deployer.id });
      await sessionWhen(h, session, (s) => s.tasks[0].status === 'input_required', 'the task to wait');
      const answers = await Promise.all(
        ['a', 'b', 'c', 'd'].map((t) => h.call('POST', `/api/v1/sessions/${session}/messages`, { body: { role: 'user', parts: text(t) } })),
      );
      expect(answers.map((r) => r.status)).to.deep.equal([201, 201, 201, 201]);
      const done = await sessionWhen(h, session, (s) => s.outcome !== null, 'the task to end');
      expect(done.tasks[0].run_ids).to.have.length(2);
      expect(model.requests).to.have.length(2);
    });
  });

  it('archiving ends every task: a waiting one, its dependent and a running one are canceled, and the session’s outcome is canceled', async () => {
    const script: ScriptedTurn[] = [{ tool_calls: [{ name: 'ask_for_input', args: { question: 'Which branch?' } }] }];
    await withAgents(script, async (h, _model, session) => {
      const deployer = await agent(h, session, { name: 'deployer' });
      await task(h, session, {
        tasks: [
          { id: 'deploy', goal: 'Deploy', agent_id: deployer.id },
          { id: 'after', steps: [{ tool: 'list_files', args: {} }], depends_on: ['deploy'] },
          { id: 'slow', steps: [{ tool: 'shell', args: { command: 'sleep 20' } }] },
        ],
      });
      await sessionWhen(
        h,
        session,
        (s) => s.tasks[0].status === 'input_required' && s.tasks.find((t: Body) => t.id === 'slow').status === 'running',
        'one task to wait, one to run',
      );
      expect((await h.call<Body>('DELETE', `/api/v1/sessions/${session}`)).body.status).to.equal('archived');
      const s = await sessionWhen(h, session, (x) => x.outcome !== null, 'the archived session’s outcome');
      expect(s.status).to.equal('archived');
      expect(s.outcome).to.equal('canceled');
      expect(s.tasks.map((t: Body) => [t.id, t.status])).to.deep.equal([
        ['deploy', 'canceled'],
        ['after', 'canceled'],
        ['slow', 'canceled'],
      ]);
      // an answer to an archived session is refused
      expect((await h.call('POST', `/api/v1/sessions/${session}/messages`, { body: { role: 'user', parts: text('main') } })).status).to.equal(409);
    });
  });

  it('adds no abort listener per model call to the run (a long loop warns of no leak)', async () => {
    const warnings: string[] = [];
    const onWarning = (w: Error) => warnings.push(`${w.name}: ${w.message}`);
    process.on('warning', onWarning);
    const script: ScriptedTurn[] = [...Array.from({ length: 14 }, () => ({ tool_calls: [{ name: 'list_files', args: {} }] })), { content: 'done' }];
    try {
      await withAgents(script, async (h, model, session) => {
        const lister = await agent(h, session, { name: 'lister', tool_allowlist: ['list_files'] });
        await task(h, session, { id: 'list', goal: 'List a lot', agent_id: lister.id });
        expect((await sessionWhen(h, session, (s) => s.outcome !== null, 'the task to end')).outcome).to.equal('succeeded');
        expect(model.requests).to.have.length(15);
      });
    } finally {
      process.off('warning', onWarning);
    }
    expect(warnings.filter((w) => w.includes('MaxListeners'))).to.deep.equal([]);
  });

  it('refuses a task with both steps and a goal, and an injected input_request', async () => {
    await withAgents([{ content: 'x' }], async (h, _model, session) => {
      const a = await agent(h, session, { name: 'a' });
      const both = await h.call<Body>('POST', `/api/v1/sessions/${session}/tasks`, {
        body: { goal: 'g', agent_id: a.id, steps: [{ tool: 'list_files', args: {} }] },
      });
      expect(both.status).to.equal(422);
      expect(both.body.detail).to.contain('not both');
      const forged = await h.call<Body>('POST', `/api/v1/sessions/${session}/messages`, { body: { role: 'user', kind: 'input_request', parts: text('?') } });
      expect(forged.status).to.equal(400);
    });
  });
});
