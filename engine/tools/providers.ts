// The action tools: codehost, chat, tracker, pager and email, one per provider. Each takes an
// `action` and its arguments, and acts through the run's connection to that provider (the engine's
// connections capability holds the SDK clients); what the provider answers is the step's output.
import type { ConnectionProvider } from '../platform/index.js';
import { runProcess } from './process.js';
import { stringArg, ToolError, type Tool, type ToolContext, type ToolResult } from './tool.js';

const repository = { type: 'string', description: 'owner/name' };
const number = { type: 'integer', minimum: 1, description: 'the pull request (or issue) number' };
const checkOutput = {
  type: 'object',
  required: ['title', 'summary'],
  properties: {
    title: { type: 'string' },
    summary: { type: 'string', description: 'Markdown' },
    annotations: {
      type: 'array',
      maxItems: 50,
      items: {
        type: 'object',
        required: ['path', 'start_line', 'message'],
        properties: {
          path: { type: 'string' },
          start_line: { type: 'integer' },
          end_line: { type: 'integer' },
          annotation_level: { type: 'string', enum: ['notice', 'warning', 'failure'] },
          message: { type: 'string' },
          title: { type: 'string' },
        },
      },
    },
  },
};
const connection = { type: 'string', description: "A connection's id or name; leave it out to use the run's (or the tenant's only one)." };

function actionTool(provider: ConnectionProvider, description: string, actions: Record<string, Record<string, unknown>>): Tool {
  return {
    name: provider,
    description,
    parameters: {
      type: 'object',
      required: ['action'],
      properties: { action: { type: 'string', enum: Object.keys(actions) }, connection, ...Object.assign({}, ...Object.values(actions)) },
    },
    async execute(args, ctx) {
      if (!ctx.connections) throw new ToolError('tool-unavailable', 'connections are not reachable from this run');
      const action = stringArg(args, 'action');
      if (!(action in actions)) throw new ToolError('invalid-args', `args.action must be one of ${Object.keys(actions).join(', ')}`);
      try {
        return { output: await ctx.connections.act(provider, action, args) };
      } catch (err) {
        if (err instanceof ToolError || ctx.signal.aborted) throw err;
        const code = (err as { code?: unknown }).code;
        if (typeof code === 'string') throw new ToolError(code, (err as Error).message);
        // an answer the SDK took but this service could not read: the step fails, not the run
        throw new ToolError('provider-error', `the ${provider} provider's answer could not be read (${(err as Error).message})`);
      }
    },
  };
}

const codehostActions = actionTool(
  'codehost',
  'Act on the code host (GitHub): check out a ref (a pull request head) into the workspace, comment on a pull request, submit a review with line comments, create or update a check run, open a pull request from a vibe run’s diff.',
  {
    checkout: { ref: { type: 'string', description: 'what to fetch: refs/pull/<n>/head, a branch or a commit' } },
    comment: { repository, number, body: { type: 'string' } },
    review: {
      event: { type: 'string', enum: ['COMMENT', 'APPROVE', 'REQUEST_CHANGES'] },
      commit_id: { type: 'string' },
      comments: {
        type: 'array',
        items: {
          type: 'object',
          required: ['path', 'line', 'body'],
          properties: { path: { type: 'string' }, line: { type: 'integer' }, side: { type: 'string', enum: ['LEFT', 'RIGHT'] }, body: { type: 'string' } },
        },
      },
    },
    create_check_run: {
      name: { type: 'string' },
      head_sha: { type: 'string' },
      conclusion: { type: 'string' },
      output: checkOutput,
      details_url: { type: 'string' },
    },
    update_check_run: { check_run_id: { type: 'integer' } },
    open_pull_request: {
      run_id: { type: 'string', description: 'the vibe run whose diff becomes the pull request' },
      base: { type: 'string', description: 'the branch it goes into (default main)' },
      head: { type: 'string', description: 'the new branch' },
      title: { type: 'string' },
    },
  },
);

const REF = /^(?!-)[\w./-]{1,250}$/;
const REPOSITORY = /^[\w.-]+\/[\w.-]+$/;
const CHECKOUT_OUTPUT_MAX = 16 * 1024;
// fetch into the workspace (a repository made when it is not one) and put its files at what was fetched
const CHECKOUT =
  'git rev-parse --git-dir >/dev/null 2>&1 || git init -q; git fetch -q --no-tags "$REMOTE" "$REF" && git checkout -q --force --detach FETCH_HEAD && git rev-parse HEAD';

/**
 * Fetches a ref of the repository from the code host into the run's workspace, in the sandbox. The
 * token reaches git only through its environment, as a header git sends to the code host's address
 * alone (http.<url>.extraHeader): never in an argument, the remote URL or the output.
 */
async function checkout(args: Record<string, unknown>, ctx: ToolContext): Promise<ToolResult> {
  if (!ctx.connections) throw new ToolError('tool-unavailable', 'connections are not reachable from this run');
  const repo = stringArg(args, 'repository');
  const ref = stringArg(args, 'ref');
  if (!REPOSITORY.test(repo)) throw new ToolError('invalid-args', 'args.repository must be owner/name');
  if (!REF.test(ref)) throw new ToolError('invalid-args', 'args.ref must be a ref name or a commit');
  if (!ctx.network)
    throw new ToolError(
      'network-required',
      'checking out fetches from the code host: the run needs network: true (and the operator SERVICE_SANDBOX_ALLOW_NETWORK=1)',
    );
  const access = await ctx.connections.git(typeof args.connection === 'string' ? args.connection : undefined);
  const remote = `${access.web_url}/${repo}.git`;
  const header = `Authorization: Basic ${Buffer.from(`x-access-token:${access.token}`).toString('base64')}`;
  const env = {
    ...ctx.childEnv,
    GIT_TERMINAL_PROMPT: '0',
    GIT_CONFIG_COUNT: '4',
    GIT_CONFIG_KEY_0: `http.${access.web_url}/.extraHeader`,
    GIT_CONFIG_VALUE_0: header,
    GIT_CONFIG_KEY_1: 'safe.directory',
    GIT_CONFIG_VALUE_1: '*',
    GIT_CONFIG_KEY_2: 'core.hooksPath',
    GIT_CONFIG_VALUE_2: '/dev/null',
    GIT_CONFIG_KEY_3: 'advice.detachedHead',
    GIT_CONFIG_VALUE_3: 'false',
    REMOTE: remote,
    REF: ref,
  };
  const r = await runProcess(ctx.sandbox, ['/bin/sh', '-c', CHECKOUT], {
    workspace: ctx.workspace,
    env,
    network: true,
    binds: ctx.binds,
    signal: ctx.signal,
    maxBytes: CHECKOUT_OUTPUT_MAX,
    onOutput: ctx.output,
  });
  const head = r.stdout.trim().split('\n').at(-1) ?? '';
  const output = { repository: repo, ref, remote, head_sha: /^[0-9a-f]{40,64}$/.test(head) ? head : null, connection_id: access.connection_id };
  if (r.aborted) return { output, error: { code: 'aborted', message: 'the checkout was stopped' } };
  if (r.exit_code !== 0)
    return {
      output: { ...output, stderr: r.stderr },
      error: { code: 'checkout-failed', message: `git could not fetch ${ref} of ${repo} (exit ${r.exit_code ?? r.signal})` },
    };
  return { output };
}

export const codehostTool: Tool = {
  ...codehostActions,
  execute: (args, ctx) => (args.action === 'checkout' ? checkout(args, ctx) : codehostActions.execute(args, ctx)),
};

export const chatTool = actionTool('chat', 'Post in chat (Slack), or reply in a thread.', {
  post: { channel: { type: 'string' }, text: { type: 'string' }, thread_ts: { type: 'string', description: 'reply in this thread' } },
  reply: {},
});

export const trackerTool = actionTool('tracker', 'Act on a tracker issue (Linear): add labels, set the priority, comment.', {
  set_labels: { issue_id: { type: 'string' }, labels: { type: 'array', items: { type: 'string' } } },
  set_priority: { priority: { type: 'integer', minimum: 0, maximum: 4, description: '0 none, 1 urgent, 2 high, 3 medium, 4 low' } },
  comment: { body: { type: 'string' } },
});

export const pagerTool = actionTool('pager', 'Act on an incident (PagerDuty): add a note, acknowledge it.', {
  add_note: { incident_id: { type: 'string' }, content: { type: 'string' } },
  acknowledge: {},
});

export const emailTool = actionTool('email', 'Send an email through the SMTP connection: a reply to a sender.', {
  reply: {
    to: { type: 'string' },
    subject: { type: 'string' },
    text: { type: 'string' },
    in_reply_to: { type: 'string', description: 'the Message-ID answered' },
    references: { type: 'string' },
  },
});

export const PROVIDER_TOOLS = [codehostTool, chatTool, trackerTool, pagerTool, emailTool];
