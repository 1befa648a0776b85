// session: acts on a multi-agent session of the run's own tenant (never another's): adds a task, or
// posts a message to an agent. `allowed_senders` and `sender` let an intake (the email-to-task
// template) add a task only for the senders it trusts.
import { mailAddress, mailDomain } from '../platform/index.js';
import { stringArg, ToolError, type Tool } from './tool.js';

/** A sender matches `*`, an address, or an `@domain` of the comma-separated list. */
export function senderAllowed(sender: string, allowed: string): boolean {
  const address = mailAddress(sender);
  if (!address) return false;
  return allowed
    .split(',')
    .map((a) => a.trim().toLowerCase())
    .filter(Boolean)
    .some((a) => a === '*' || a === address || (a.startsWith('@') && mailDomain(address) === a.slice(1)));
}

export const sessionTool: Tool = {
  name: 'session',
  description: 'Add a task to a multi-agent session of this tenant, or post a message to an agent of one.',
  parameters: {
    type: 'object',
    required: ['action', 'session_id'],
    properties: {
      action: { type: 'string', enum: ['add_task', 'post_message'] },
      session_id: { type: 'string' },
      task: {
        type: 'object',
        properties: {
          title: { type: 'string' },
          goal: { type: 'string' },
          agent_id: { type: 'string' },
          depends_on: { type: 'array', items: { type: 'string' } },
        },
      },
      message: { type: 'object', properties: { text: { type: 'string' }, to: { type: 'string' } } },
      sender: { type: 'string', description: 'Who asked (an email address); checked against allowed_senders.' },
      cut_to_limits: { type: 'boolean', description: 'Cut a task title over 200 and a goal over 20,000 characters to fit, rather than fail.' },
      allowed_senders: { type: 'string', description: 'Comma-separated addresses or @domains; * for anyone.' },
    },
  },
  async execute(args, ctx) {
    if (!ctx.sessions) throw new ToolError('tool-unavailable', 'sessions are not reachable from this run');
    const action = stringArg(args, 'action');
    const sessionId = stringArg(args, 'session_id');
    if (typeof args.allowed_senders === 'string') {
      const sender = typeof args.sender === 'string' ? args.sender : '';
      if (!senderAllowed(sender, args.allowed_senders)) return { output: { done: false, reason: `sender ${sender || '(none)'} is not allowed` } };
    }
    // the one address that was checked: what an answer may go to
    const checked = typeof args.sender === 'string' ? mailAddress(args.sender) : null;
    if (action === 'add_task') {
      const task = (args.task && typeof args.task === 'object' ? args.task : {}) as Record<string, unknown>;
      const added = await ctx.sessions.addTask(sessionId, task, { cut: args.cut_to_limits === true });
      return { output: { done: true, session_id: sessionId, task_id: added.id, ...(checked ? { sender: checked } : {}) } };
    }
    if (action === 'post_message') {
      const message = (args.message && typeof args.message === 'object' ? args.message : {}) as Record<string, unknown>;
      const posted = await ctx.sessions.postMessage(sessionId, {
        text: stringArg(message, 'text'),
        to: typeof message.to === 'string' ? message.to : undefined,
      });
      return { output: { done: true, session_id: sessionId, message_id: posted.id, seq: posted.seq } };
    }
    throw new ToolError('invalid-args', 'args.action must be add_task or post_message');
  },
};
