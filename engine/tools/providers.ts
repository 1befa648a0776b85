// The action tools: codehost, chat, tracker, pager and email, one per provider. Each takes an
// `action` and its arguments, and acts through the run's connection to that provider (the engine's
// connections capability holds the SDK clients); what the provider answers is the step's output.
import type { ConnectionProvider } from '../platform/index.js';
import { stringArg, ToolError, type Tool } from './tool.js';

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
        const code = (err as { code?: unknown }).code;
        if (typeof code === 'string' && !(err instanceof ToolError)) throw new ToolError(code, (err as Error).message);
        throw err;
      }
    },
  };
}

export const codehostTool = actionTool(
  'codehost',
  'Act on the code host (GitHub): comment on a pull request, submit a review with line comments, create or update a check run.',
  {
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
  },
);

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
