// The agent loop against a model client that answers from a script (no endpoint): what it counts across
// the agent steps of one attempt.
import { expect } from 'chai';
import { runAgent, type ModelClient } from '../../engine/runs/agent.js';

type Answer = Awaited<ReturnType<ModelClient['complete']>>;

/** A client that answers each call with the next answer of the script; `sent` keeps what each call was sent. */
function scripted(answers: Answer[], sent: unknown[][] = []): ModelClient {
  let next = 0;
  return {
    defaultModel: 'scripted',
    complete: async (_model: string, messages: unknown[]) => {
      sent.push(structuredClone(messages));
      return answers[next++]!;
    },
  } as unknown as ModelClient;
}

const call = (id: string, args: string): Answer => ({
  content: null,
  tool_calls: [{ id, type: 'function', function: { name: 'write_file', arguments: args } }],
});

describe('agent loop', () => {
  it('holds the calls of an attempt’s agent steps to one room for their arguments together, not one room each', async () => {
    const room = { left: 100 };
    const called: string[] = [];
    const refused: string[] = [];
    const loop = (client: ModelClient) =>
      runAgent({
        client,
        model: null,
        goal: 'write',
        inputs: {},
        tools: [],
        canAsk: false,
        inbox: async () => [],
        signal: new AbortController().signal,
        stepsLeft: () => undefined,
        callTool: async (_tool, args, refusal) => {
          if (refusal) refused.push(refusal.code);
          else called.push(String(args.path));
          return { output: {}, ...(refusal ? { error: refusal } : {}) };
        },
        argsMaxBytes: { call: 1000, attempt: 100 },
        argsRoom: room,
        onTurn: async () => undefined,
      });
    const args = (name: string) => JSON.stringify({ path: name, content: 'x'.repeat(40) }); // 60 bytes
    await loop(scripted([call('1', args('first')), { content: 'done', tool_calls: [] }]));
    expect(room.left).to.equal(100 - args('first').length);
    // the second agent step of the same attempt: its 60 bytes no longer fit in the 40 left
    await loop(scripted([call('2', args('second')), { content: 'done', tool_calls: [] }]));
    expect(called).to.deep.equal(['first']);
    expect(refused).to.deep.equal(['attempt-args-too-large']);
  });

  it('tells a continued conversation its goal when it changed while the task waited (its agent’s instructions edited), and only then', async () => {
    const conversation = [
      { role: 'system' as const, content: 'You are an automation agent.' },
      { role: 'user' as const, content: 'OLD-INSTR\n\nYour task: deploy\n\nInputs: {}' },
      { role: 'assistant' as const, content: null },
    ];
    const firstCall = async (goal: string) => {
      const sent: unknown[][] = [];
      await runAgent({
        client: scripted([{ content: 'done', tool_calls: [] }], sent),
        model: null,
        goal,
        inputs: {},
        tools: [],
        conversation,
        canAsk: true,
        inbox: async () => [],
        signal: new AbortController().signal,
        stepsLeft: () => undefined,
        callTool: async () => ({ output: {} }),
        argsMaxBytes: { call: 1000, attempt: 1000 },
        argsRoom: { left: 1000 },
        onTurn: async () => undefined,
      });
      return JSON.stringify(sent[0]);
    };
    expect(await firstCall('OLD-INSTR\n\nYour task: deploy')).not.to.contain('instructions changed');
    expect(await firstCall('NEW-INSTR\n\nYour task: deploy'))
      .to.contain('Your instructions changed while you waited')
      .and.contain('NEW-INSTR');
    // told once: a later continuation with the same new goal adds nothing more
    conversation.push({ role: 'system' as never, content: 'Your instructions changed while you waited. From now on:\nNEW-INSTR\n\nYour task: deploy' });
    expect((await firstCall('NEW-INSTR\n\nYour task: deploy')).match(/instructions changed/g)).to.have.length(1);
  });
});
