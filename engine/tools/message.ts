// message: posts a message. In a multi-agent session's task it joins the session's durable log as its
// agent's, to another agent of the session (`to`: its id or name) or to all; elsewhere it is an event
// on the run's session stream.
import { stringArg, ToolError, type Tool } from './tool.js';

export const messageTool: Tool = {
  name: 'message',
  description: "Post a message: to another agent of this session (`to`: its id or name), or to the session's log.",
  parameters: {
    type: 'object',
    required: ['text'],
    properties: {
      text: { type: 'string' },
      to: { type: 'string', description: 'An agent of this session, by id, or by a name only one agent has; absent for everyone.' },
      role: { type: 'string', enum: ['assistant', 'system', 'user'] },
    },
  },
  async execute(args, ctx) {
    const text = stringArg(args, 'text');
    const to = typeof args.to === 'string' && args.to ? args.to : undefined;
    const own = ctx.sessions?.own;
    if (own) {
      const posted = await own.say({ text, to });
      return { output: { message_id: posted.id, seq: posted.seq, to: to ?? null, text } };
    }
    if (to) throw new ToolError('invalid-args', 'args.to names an agent of a multi-agent session, and this run is not a task of one');
    const role = args.role === 'system' || args.role === 'user' ? args.role : 'assistant';
    await ctx.message(role, text);
    return { output: { role, text } };
  },
};
