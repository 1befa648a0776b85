// The agent loop: a goal, the allowed tools, and an OpenAI-compatible chat-completions endpoint with
// tool calling. Each model turn may call tools; their results go back to the model; the loop ends
// when the model answers without a tool call, the budget ends, or max_steps is reached.
import type { AgentTurn } from '../platform/index.js';
import type { Tool, ToolResult } from '../tools/index.js';

export type AgentEndpoint = { baseUrl: string; apiKey: string | undefined; model: string };

type ChatMessage =
  | { role: 'system' | 'user'; content: string }
  | { role: 'assistant'; content: string | null; tool_calls?: ToolCall[] }
  | { role: 'tool'; tool_call_id: string; content: string };

type ToolCall = { id: string; type: 'function'; function: { name: string; arguments: string } };

export type AgentOutcome = { answer: string | null; stopped_by: 'answer' | 'max_steps' };

export class AgentError extends Error {
  constructor(
    readonly code: 'agent-error' | 'agent-protocol',
    message: string,
  ) {
    super(message);
  }
}

const RESULT_MAX_CHARS = 16_000;

export async function runAgent(opts: {
  endpoint: AgentEndpoint;
  goal: string;
  inputs: Record<string, unknown>;
  tools: Tool[];
  signal: AbortSignal;
  /** how many more tool calls the run may make; undefined: no bound */
  stepsLeft: () => number | undefined;
  callTool(name: string, args: Record<string, unknown>): Promise<ToolResult>;
  onTurn(turn: Omit<AgentTurn, 'index' | 'at'>): Promise<void>;
}): Promise<AgentOutcome> {
  const messages: ChatMessage[] = [
    {
      role: 'system',
      content:
        'You are an automation agent working in a software workspace. Use the tools to reach the goal, ' +
        'then answer with a short summary of what you did and found, without calling a tool.',
    },
    { role: 'user', content: Object.keys(opts.inputs).length ? `${opts.goal}\n\nInputs: ${JSON.stringify(opts.inputs)}` : opts.goal },
  ];
  const tools = opts.tools.map((t) => ({ type: 'function' as const, function: { name: t.name, description: t.description, parameters: t.parameters } }));
  for (;;) {
    const message = await complete(opts.endpoint, messages, tools, opts.signal);
    const calls = message.tool_calls ?? [];
    const parsed = calls.map((c) => ({ id: c.id, tool: c.function.name, args: parseArgs(c.function.arguments) }));
    await opts.onTurn({ content: message.content ?? null, tool_calls: parsed, usage: message.usage });
    messages.push({ role: 'assistant', content: message.content ?? null, ...(calls.length ? { tool_calls: calls } : {}) });
    if (calls.length === 0) return { answer: message.content ?? null, stopped_by: 'answer' };
    for (const call of parsed) {
      const left = opts.stepsLeft();
      if (left !== undefined && left <= 0) return { answer: null, stopped_by: 'max_steps' };
      const result = await opts.callTool(call.tool, call.args);
      const content = JSON.stringify(result.error ? { error: result.error, output: result.output } : result.output);
      messages.push({
        role: 'tool',
        tool_call_id: call.id,
        content: content.length > RESULT_MAX_CHARS ? `${content.slice(0, RESULT_MAX_CHARS)}…(truncated)` : content,
      });
      if (opts.signal.aborted) throw opts.signal.reason;
    }
  }
}

function parseArgs(text: string): Record<string, unknown> {
  try {
    const v: unknown = JSON.parse(text || '{}');
    return v && typeof v === 'object' && !Array.isArray(v) ? (v as Record<string, unknown>) : {};
  } catch {
    return {};
  }
}

async function complete(
  endpoint: AgentEndpoint,
  messages: ChatMessage[],
  tools: unknown[],
  signal: AbortSignal,
): Promise<{ content?: string | null; tool_calls?: ToolCall[]; usage?: { prompt_tokens?: number; completion_tokens?: number } }> {
  let res: Response;
  try {
    res = await fetch(`${endpoint.baseUrl.replace(/\/$/, '')}/chat/completions`, {
      method: 'POST',
      headers: { 'content-type': 'application/json', ...(endpoint.apiKey ? { authorization: `Bearer ${endpoint.apiKey}` } : {}) },
      body: JSON.stringify({ model: endpoint.model, messages, ...(tools.length ? { tools, tool_choice: 'auto' } : {}) }),
      signal,
    });
  } catch (err) {
    if (signal.aborted) throw signal.reason;
    throw new AgentError('agent-error', `the model endpoint did not answer: ${(err as Error).message}`);
  }
  if (!res.ok) throw new AgentError('agent-error', `the model endpoint answered HTTP ${res.status}`);
  const body = (await res.json().catch(() => null)) as { choices?: { message?: Record<string, unknown> }[]; usage?: Record<string, number> } | null;
  const message = body?.choices?.[0]?.message;
  if (!message) throw new AgentError('agent-protocol', 'the model endpoint answered without choices[0].message');
  return { ...(message as { content?: string | null; tool_calls?: ToolCall[] }), usage: body?.usage };
}
