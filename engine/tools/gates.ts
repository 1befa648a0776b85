// gates: runs the gate set of the run's workspace (gates.yaml, or the detected set) as a gate run
// (one job per gate, sealed into the evidence ledger) and waits for it. A required gate that does not
// pass fails the step.
import { ToolError, type Tool } from './tool.js';

export const gatesTool: Tool = {
  name: 'gates',
  description: "Run the workspace's gates (gates.yaml, or those detected) and report each one's conclusion.",
  parameters: {
    type: 'object',
    properties: {
      only: { type: 'array', items: { type: 'string' }, description: 'Run only these gates, by id.' },
      ref: { type: 'string', description: 'The git ref the gates are for (recorded with the step).' },
    },
  },
  async execute(args, ctx) {
    if (!ctx.gates) throw new ToolError('tool-unavailable', "gates run on a run's own workspace; this run has none they can use");
    const only = Array.isArray(args.only) ? args.only.filter((g): g is string => typeof g === 'string') : undefined;
    const r = await ctx.gates.run({ only }, ctx.signal);
    const output = {
      gate_run_id: r.id,
      status: r.status,
      ready: r.status === 'succeeded',
      results: r.results.map((g) => ({ gate_id: g.gate_id, required: g.required, conclusion: g.conclusion, summary: g.summary })),
      ledger: r.ledger,
      ...(typeof args.ref === 'string' ? { ref: args.ref } : {}),
    };
    for (const g of output.results) ctx.output('stdout', `${g.conclusion.padEnd(9)} ${g.gate_id}${g.required ? '' : ' (optional)'}: ${g.summary}\n`);
    if (r.status === 'canceled') return { output, error: { code: 'aborted', message: 'the gate run was stopped' } };
    const failed = r.results.filter((g) => g.required && g.conclusion !== 'success').map((g) => g.gate_id);
    if (failed.length) return { output, error: { code: 'gates-failed', message: `required gates did not pass: ${failed.join(', ')}` } };
    return { output };
  },
};
