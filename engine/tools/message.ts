// message: appends a message to the run's session log (an event every stream subscriber sees).
import { stringArg, type Tool } from './tool.js';

export const messageTool: Tool = {
  name: 'message',
  description: "Post a message to the run's session log.",
  parameters: {
    type: 'object',
    required: ['text'],
    properties: { text: { type: 'string' }, role: { type: 'string', enum: ['assistant', 'system', 'user'] } },
  },
  async execute(args, ctx) {
    const text = stringArg(args, 'text');
    const role = args.role === 'system' || args.role === 'user' ? args.role : 'assistant';
    await ctx.message(role, text);
    return { output: { role, text } };
  },
};
