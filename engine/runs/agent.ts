// The agent loop: a goal, the allowed tools, and an OpenAI-compatible chat-completions endpoint with
// tool calling, through the `openai` SDK (it times a call out; we try again after 408, 409, 429 and
// 5xx answers and timeouts, honouring `Retry-After` within the run's budget). Each model turn may call
// tools; their results go back to the model; before each model call the agent's inbox (messages posted to it meanwhile) joins the
// conversation. The loop ends when the model answers without a tool call, asks for input (the run
// ends; the conversation is kept for the run that the answer starts), the budget ends, or max_steps is reached.
import OpenAI from 'openai';
import { MESSAGE_TEXT_MAX, wellFormed, type AgentTurn, type ChatMessage, type ChatToolCall, type ErrorInfo } from '../platform/index.js';
import type { Tool, ToolResult } from '../tools/index.js';

export type AgentEndpoint = { baseUrl: string; apiKey: string | undefined; model: string; timeoutSeconds: number; maxRetries: number };

export type AgentOutcome =
  | { stopped_by: 'answer'; answer: string | null; conversation: ChatMessage[] }
  | { stopped_by: 'max_steps'; conversation: ChatMessage[] }
  | { stopped_by: 'input_required'; question: string; conversation: ChatMessage[] };

export class AgentError extends Error {
  constructor(
    readonly code: 'agent-error' | 'agent-protocol',
    message: string,
  ) {
    super(message);
  }
}

/**
 * A conversation picked up where it stopped (a question answered): its goal as it was asked, and the run's goal
 * after it when that changed since (its agent's instructions edited while the task waited), which the run
 * records and so the model is told.
 */
function continued(conversation: ChatMessage[], goal: string): ChatMessage[] {
  // the goal it was last given: a change told at an earlier continuation, else the one it was asked
  const told = conversation.findLast((m) => m.role === 'system' && typeof m.content === 'string' && m.content.startsWith(GOAL_CHANGED));
  const last = told ? (told.content as string).slice(GOAL_CHANGED.length) : conversation.find((m) => m.role === 'user')?.content;
  if (!goal || (typeof last === 'string' && last.startsWith(goal))) return [...conversation];
  return [...conversation, { role: 'system', content: `${GOAL_CHANGED}${goal}` }];
}
const GOAL_CHANGED = 'Your instructions changed while you waited. From now on:\n';

/** What one tool result or inbox message may add to the conversation. */
const CONTENT_MAX_CHARS = 16_000;
const capped = (text: string) => (text.length > CONTENT_MAX_CHARS ? `${text.slice(0, CONTENT_MAX_CHARS)}…(truncated)` : text);

/** A question is a message: one longer than a message may be could not be posted, and failed the run as `internal` on every try. */
const QUESTION_MAX_CHARS = MESSAGE_TEXT_MAX;
const QUESTION_CUT = '…(truncated)';
const cutQuestion = (text: string) =>
  text.length > QUESTION_MAX_CHARS && [...text].length > QUESTION_MAX_CHARS
    ? `${[...text].slice(0, QUESTION_MAX_CHARS - QUESTION_CUT.length).join('')}${QUESTION_CUT}`
    : text;

/** The pseudo-tool a session task's agent calls to ask a person (or another agent) for input. */
export const ASK_TOOL = 'ask_for_input';
const askTool = {
  type: 'function' as const,
  function: {
    name: ASK_TOOL,
    description: 'Ask for input you cannot find yourself. Your work pauses (nothing runs while you wait) and resumes with the answer as a new message.',
    parameters: { type: 'object', required: ['question'], properties: { question: { type: 'string' } } },
  },
};

/** One client per endpoint: the SDK keeps its connections; the tries and the waits between them are ours (below). */
export function modelClientOf(endpoint: AgentEndpoint) {
  const client = new OpenAI({
    baseURL: endpoint.baseUrl,
    // a local endpoint may need no key: then no Authorization header is sent
    apiKey: endpoint.apiKey ?? 'unused',
    defaultHeaders: endpoint.apiKey ? {} : { Authorization: null },
    // only what the service is configured with: nothing from OPENAI_* variables of the process
    organization: null,
    project: null,
    adminAPIKey: null,
    webhookSecret: null,
    timeout: endpoint.timeoutSeconds * 1000,
    // the SDK's own retries slept through a cancel and the budget (a timer that outlived the run), waited out
    // any Retry-After however far past the budget, and read a Retry-After of "soon" or "-5" as no wait at all
    maxRetries: 0,
    // the SDK's timer stops when fetch resolves on the headers: a body that stalls after them held the run to
    // its budget. Read inside fetch, the body is under the same timer, and a stall is a timeout, tried again
    fetch: readWhole,
    logLevel: 'off',
  });

  /** One try, its abort tied to the run's signal and untied after: a long loop adds no listeners to the run's signal. */
  async function once(model: string, messages: ChatMessage[], tools: unknown[], signal: AbortSignal): Promise<unknown> {
    const call = new AbortController();
    const stop = () => call.abort(signal.reason);
    if (signal.aborted) stop();
    else signal.addEventListener('abort', stop, { once: true });
    try {
      return await client.chat.completions.create(
        {
          model,
          messages: messages as OpenAI.ChatCompletionMessageParam[],
          ...(tools.length ? { tools: tools as OpenAI.ChatCompletionTool[], tool_choice: 'auto' } : {}),
        },
        { signal: call.signal },
      );
    } finally {
      signal.removeEventListener('abort', stop);
    }
  }

  return {
    defaultModel: endpoint.model,
    /**
     * A model call, tried again (up to SERVICE_AGENT_MAX_RETRIES more times) when it was not answered in time, could
     * not connect, or was answered 408, 409, 429 or 5xx, after the wait the endpoint asks for or a backoff. A wait
     * that would end past `deadlineAt` (the run's budget) fails the call at once; a cancel or the budget ends a wait.
     */
    async complete(model: string, messages: ChatMessage[], tools: unknown[], signal: AbortSignal, deadlineAt?: number): Promise<Answer> {
      for (let tries = 1; ; tries++) {
        let body: unknown;
        try {
          body = await once(model, messages, tools, signal);
        } catch (err) {
          if (signal.aborted) throw signal.reason;
          const said = tried(endpoint, err, tries);
          if (tries > endpoint.maxRetries || !retried(err)) throw said;
          const asked = err instanceof OpenAI.APIError ? retryAfterMs(err.headers) : null;
          const wait = asked ?? backoffMs(tries);
          if (deadlineAt !== undefined && Date.now() + wait >= deadlineAt) {
            const left = Math.max(0, deadlineAt - Date.now());
            throw new AgentError(
              'agent-error',
              `${said.message}; the next try was ${asked === null ? 'due' : 'asked for'} in ${seconds(wait)} s, after the run's budget ends (${seconds(left)} s left)`,
            );
          }
          await sleepUnless(wait, signal);
          continue;
        }
        return answerOf(body);
      }
    },
  };
}

/** Statuses the SDK retried, as we do: a timeout, a lock, the rate limit, the endpoint's own errors; `x-should-retry` overrules. */
function retried(err: unknown): boolean {
  // an answer the service refused itself (over ANSWER_MAX_BYTES) is not asked for again
  if (ownRefusal(err)) return false;
  if (err instanceof OpenAI.APIConnectionError) return true; // timeouts too: APIConnectionTimeoutError is one
  if (!(err instanceof OpenAI.APIError) || err.status === undefined) return false;
  const told = err.headers?.get('x-should-retry');
  if (told === 'true' || told === 'false') return told === 'true';
  return err.status === 408 || err.status === 409 || err.status === 429 || err.status >= 500;
}

/** The wait before try n + 1 when the endpoint asks for none: 0.5 s doubled each time up to 8 s, less up to a quarter at random (the SDK's). */
const backoffMs = (tries: number) => Math.min(500 * 2 ** (tries - 1), 8000) * (1 - Math.random() * 0.25);

const DELTA = /^\s*(\d+(?:\.\d+)?)\s*$/;

/**
 * The wait an answer asks for, in ms: `retry-after-ms`, else `Retry-After` as seconds or an HTTP date (one already
 * past is no wait). Null when it asks none that reads: a value that is not a number of zero or more, nor a date.
 */
export function retryAfterMs(headers: Headers | undefined, now = Date.now()): number | null {
  const ms = DELTA.exec(headers?.get('retry-after-ms') ?? '');
  if (ms) return Number(ms[1]);
  const after = headers?.get('retry-after')?.trim();
  if (!after) return null;
  const delta = DELTA.exec(after);
  if (delta) return Number(delta[1]) * 1000;
  // an HTTP date names its day and its zone (RFC 9110): a bare number or word that Date.parse reads is none
  const at = /[a-z]{3}.*\d{2}:\d{2}:\d{2}/i.test(after) ? Date.parse(after) : NaN;
  return Number.isNaN(at) ? null : Math.max(0, at - now);
}

const seconds = (ms: number) => String(Math.round(ms / 100) / 10);

/** Waits `ms`, or until the signal aborts (then throws its reason): no timer is left behind either way. */
function sleepUnless(ms: number, signal: AbortSignal): Promise<void> {
  return new Promise((resolve, reject) => {
    const done = () => {
      clearTimeout(timer);
      signal.removeEventListener('abort', stopped);
    };
    const stopped = () => {
      done();
      reject(signal.reason);
    };
    const timer = setTimeout(() => {
      done();
      resolve();
    }, ms);
    if (signal.aborted) stopped();
    else signal.addEventListener('abort', stopped, { once: true });
  });
}

export type ModelClient = ReturnType<typeof modelClientOf>;

/** The most of a model endpoint's answer read: past it the answer is refused (agent-protocol), not held whole in memory. */
const ANSWER_MAX_BYTES = 16 * 1024 * 1024;

/** A fetch that resolves once the whole body has arrived, so the SDK's timeout and abort cover the body too. */
async function readWhole(url: string | URL | Request, init?: RequestInit): Promise<Response> {
  const res = await fetch(url, init);
  const chunks: Uint8Array[] = [];
  let size = 0;
  for await (const chunk of (res.body ?? []) as AsyncIterable<Uint8Array>) {
    size += chunk.length;
    if (size > ANSWER_MAX_BYTES) {
      await res.body?.cancel().catch(() => undefined);
      throw new AgentError('agent-protocol', `the model endpoint's answer is over ${ANSWER_MAX_BYTES / 1024 / 1024} MB`);
    }
    chunks.push(chunk);
  }
  const body = Buffer.concat(chunks);
  // a status that carries no body (204, 304) may not be given one
  const empty = res.status === 204 || res.status === 205 || res.status === 304;
  return new Response(empty ? null : body, { status: res.status, statusText: res.statusText, headers: res.headers });
}

type Answer = { content: string | null; tool_calls: ChatToolCall[]; usage?: { prompt_tokens?: number; completion_tokens?: number } };

/**
 * The answer, checked against the shape the loop relies on: the SDK passes on whatever JSON the endpoint
 * sent, and a string method called on a number, or a tool name that is not a string, failed the run as
 * `internal` or stored a step the API cannot show. What does not fit is the endpoint's fault: agent-protocol.
 */
function answerOf(body: unknown): Answer {
  const refuse = (what: string) => new AgentError('agent-protocol', `the model endpoint's answer could not be read: ${what}`);
  const message = (body as { choices?: { message?: unknown }[] } | null)?.choices?.[0]?.message;
  if (!message || typeof message !== 'object') throw new AgentError('agent-protocol', 'the model endpoint answered without choices[0].message');
  const m = message as { content?: unknown; tool_calls?: unknown };
  // what is stored and served is well-formed Unicode, as what a request may send: a lone surrogate in the
  // answer's text or a call's name made strict readers refuse the run, its page of the list and its events
  const content = contentOf(m.content, refuse);
  return {
    content: content === null ? null : wellFormed(content),
    tool_calls: toolCallsOf(m.tool_calls, refuse),
    usage: usageOf((body as { usage?: unknown }).usage),
  };
}

/** A message's text: a string, none, or (as some endpoints send it) a list of text parts, read as their texts joined. */
function contentOf(content: unknown, refuse: (what: string) => AgentError): string | null {
  if (content === undefined || content === null) return null;
  if (typeof content === 'string') return content;
  if (Array.isArray(content)) {
    const texts = content.map((p: unknown) =>
      p && typeof p === 'object' && typeof (p as { text?: unknown }).text === 'string' ? (p as { text: string }).text : null,
    );
    if (texts.every((t): t is string => t !== null)) return texts.join('');
  }
  throw refuse('choices[0].message.content is neither a string nor a list of text parts');
}

/** The calls of a function tool; arguments sent as a JSON object (not the text of one) are taken as their text. */
function toolCallsOf(calls: unknown, refuse: (what: string) => AgentError): ChatToolCall[] {
  if (calls === undefined || calls === null) return [];
  if (!Array.isArray(calls)) throw refuse('choices[0].message.tool_calls is not a list');
  const out: ChatToolCall[] = [];
  for (const c of calls as unknown[]) {
    const call = (c && typeof c === 'object' ? c : {}) as { id?: unknown; type?: unknown; function?: unknown };
    // a call of another kind of tool than a function is none of ours: it was always passed over
    if (call.type !== undefined && call.type !== 'function') continue;
    const fn = (call.function && typeof call.function === 'object' ? call.function : null) as { name?: unknown; arguments?: unknown } | null;
    if (typeof call.id !== 'string' || !fn || typeof fn.name !== 'string') throw refuse('a tool call lacks a string id or a function with a string name');
    const args = typeof fn.arguments === 'string' ? fn.arguments : fn.arguments && typeof fn.arguments === 'object' ? JSON.stringify(fn.arguments) : null;
    if (args === null) throw refuse(`the arguments of a call of ${fn.name} are neither JSON text nor an object`);
    out.push({ id: wellFormed(call.id), type: 'function', function: { name: wellFormed(fn.name), arguments: wellFormed(args) } });
  }
  return out;
}

/** Token counts the endpoint reported: only whole numbers of zero or more count (a string was added as text, a negative kept). */
function usageOf(usage: unknown): Answer['usage'] {
  if (!usage || typeof usage !== 'object') return undefined;
  const count = (n: unknown) => (typeof n === 'number' && Number.isInteger(n) && n >= 0 ? n : undefined);
  const u = usage as { prompt_tokens?: unknown; completion_tokens?: unknown };
  return { prompt_tokens: count(u.prompt_tokens), completion_tokens: count(u.completion_tokens) };
}

/** What the service itself refused of an answer (over ANSWER_MAX_BYTES), which the SDK wraps as a connection's failure. */
function ownRefusal(err: unknown): AgentError | null {
  const cause = (err as { cause?: unknown } | null)?.cause;
  return cause instanceof AgentError ? cause : null;
}

/** Why a call failed, and after how many tries. */
function tried(endpoint: AgentEndpoint, err: unknown, tries: number): AgentError {
  const after = `after ${tries} tr${tries === 1 ? 'y' : 'ies'}`;
  const own = ownRefusal(err);
  if (own) return own;
  if (err instanceof OpenAI.APIConnectionTimeoutError)
    return new AgentError('agent-error', `the model endpoint did not answer within ${endpoint.timeoutSeconds} s (${after})`);
  if (err instanceof OpenAI.APIConnectionError) return new AgentError('agent-error', `the model endpoint could not be reached (${after})`);
  if (err instanceof OpenAI.APIError) return new AgentError('agent-error', `the model endpoint answered HTTP ${err.status ?? '?'} (${after})`);
  return new AgentError('agent-protocol', `the model endpoint's answer could not be read: ${(err as Error).message}`);
}

export async function runAgent(opts: {
  client: ModelClient;
  /** the agent's own model, or the endpoint's default */
  model: string | null;
  goal: string;
  inputs: Record<string, unknown>;
  tools: Tool[];
  /** where a run that answers a question picks up; absent for a fresh start */
  conversation?: ChatMessage[];
  /** offer the ask_for_input tool: the run may end waiting for an answer */
  canAsk: boolean;
  /** messages posted to this agent since it last looked, as text for the conversation */
  inbox(): Promise<string[]>;
  signal: AbortSignal;
  /** when the run's budget ends (ms since the epoch): no wait between a call's tries goes past it */
  deadlineAt?: number;
  /** how many more tool calls the run may make; undefined: no bound */
  stepsLeft: () => number | undefined;
  /** a call with `refused` is kept as a failed step without running the tool (arguments that are not a JSON object) */
  callTool(name: string, args: Record<string, unknown>, refused?: ErrorInfo): Promise<ToolResult>;
  /** the most a call's arguments may be (JSON, bytes), and all of the attempt's calls' together: a plan step's bounds */
  argsMaxBytes: { call: number; attempt: number };
  /** what the attempt's arguments have left of `argsMaxBytes.attempt`, shared with its plan's steps and other agent steps */
  argsRoom: { left: number };
  onTurn(turn: Omit<AgentTurn, 'index' | 'at'>): Promise<void>;
}): Promise<AgentOutcome> {
  const messages: ChatMessage[] = opts.conversation
    ? continued(opts.conversation, opts.goal)
    : [
        {
          role: 'system',
          content:
            'You are an automation agent working in a software workspace. Use the tools to reach the goal, ' +
            'then answer with a short summary of what you did and found, without calling a tool.',
        },
        { role: 'user', content: Object.keys(opts.inputs).length ? `${opts.goal}\n\nInputs: ${JSON.stringify(opts.inputs)}` : opts.goal },
      ];
  const tools = [
    ...opts.tools.map((t) => ({ type: 'function' as const, function: { name: t.name, description: t.description, parameters: t.parameters } })),
    ...(opts.canAsk ? [askTool] : []),
  ];
  const model = opts.model ?? opts.client.defaultModel;
  // messages posted to the agent, read before each model call and once more before an answer is its last word
  let inbox = await opts.inbox();
  for (;;) {
    for (const text of inbox) messages.push({ role: 'user', content: capped(text) });
    const message = await opts.client.complete(model, messages, tools, opts.signal, opts.deadlineAt);
    const calls = message.tool_calls;
    const parsed = calls.map((c) => {
      const one = { id: c.id, tool: c.function.name, ...parseArgs(c.function.arguments, opts.argsMaxBytes.call) };
      if (!one.refused && (opts.argsRoom.left -= Buffer.byteLength(c.function.arguments)) < 0)
        return { ...one, args: invalidArgs(c.function.arguments), refused: attemptArgsRefusal(opts.argsMaxBytes.attempt) };
      return one;
    });
    await opts.onTurn({
      content: message.content && capped(message.content),
      tool_calls: parsed.map(({ id, tool, args }) => ({ id, tool, args })),
      usage: message.usage,
    });
    messages.push({ role: 'assistant', content: message.content, ...(calls.length ? { tool_calls: calls } : {}) });
    if (calls.length === 0) {
      // messages posted while the model answered are read before its answer is taken as the last word
      inbox = await opts.inbox();
      if (!inbox.length) return { stopped_by: 'answer', answer: message.content, conversation: messages };
      continue;
    }
    let question: string | null = null;
    for (const call of parsed) {
      let content: string;
      if (call.tool === ASK_TOOL && opts.canAsk) {
        question = typeof call.args.question === 'string' && call.args.question.trim() ? cutQuestion(call.args.question) : 'What should I do next?';
        content = JSON.stringify({ asked: true, note: 'The answer arrives as a message.' });
      } else {
        const left = opts.stepsLeft();
        if (left !== undefined && left <= 0) return { stopped_by: 'max_steps', conversation: messages };
        const result = await opts.callTool(call.tool, call.args, call.refused);
        content = JSON.stringify(result.error ? { error: result.error, output: result.output } : result.output);
      }
      messages.push({ role: 'tool', tool_call_id: call.id, content: capped(content) });
      if (opts.signal.aborted) throw opts.signal.reason;
    }
    if (question !== null) return { stopped_by: 'input_required', question, conversation: messages };
    inbox = await opts.inbox();
  }
}

/** What the model sent as a call's arguments: kept as it is, in `invalid_arguments`, when it is not a JSON object. */
const INVALID_ARGS_KEPT = 2000;
const invalidArgs = (text: string): Record<string, unknown> => ({ invalid_arguments: text.slice(0, INVALID_ARGS_KEPT) });

const attemptArgsRefusal = (max: number): ErrorInfo => ({
  code: 'attempt-args-too-large',
  message: `the arguments of this attempt's calls make more than ${max} bytes of JSON in all: the tool was not called`,
});

/**
 * A call's arguments, or why they are refused: text that is not a JSON object ran the tool with none (`{}`),
 * as if the call had been what the model meant, and the model was told it worked.
 */
function parseArgs(text: string, maxBytes: number): { args: Record<string, unknown>; refused?: ErrorInfo } {
  // as a plan step's: a call's arguments go whole into its step, its events and its turn
  if (Buffer.byteLength(text) > maxBytes)
    return {
      args: invalidArgs(text),
      refused: { code: 'args-too-large', message: `the arguments are over ${maxBytes} bytes of JSON: the tool was not called` },
    };
  let v: unknown;
  try {
    // the arguments' own escapes (`\\ud800` in their text) may spell a lone surrogate
    v = wellFormed(JSON.parse(text || '{}'));
  } catch {
    v = undefined;
  }
  if (v && typeof v === 'object' && !Array.isArray(v)) return { args: v as Record<string, unknown> };
  return {
    args: invalidArgs(text),
    refused: { code: 'invalid-args', message: 'the arguments are not a JSON object: the tool was not called; send them again as one' },
  };
}
