// gates: runs the gate set of the run's workspace (gates.yaml, or the detected set) as a gate run
// (one job per gate, sealed into the evidence ledger) and waits for it. A required gate that does not
// pass fails the step.
import type { GateRunRecord } from '../platform/index.js';
import { stringArg, ToolError, type Tool, type ToolContext } from './tool.js';

function checkRunsOf(args: Record<string, unknown>): { repository: string; head_sha: string } | null {
  const c = args.check_runs;
  if (c === undefined || c === null) return null;
  if (typeof c !== 'object') throw new ToolError('invalid-args', 'args.check_runs must be an object with repository and head_sha');
  return { repository: stringArg(c as Record<string, unknown>, 'repository'), head_sha: stringArg(c as Record<string, unknown>, 'head_sha') };
}

/** One check run per gate on the commit, with the gate's conclusion, summary and annotations (those with a file). */
async function reportChecks(report: { repository: string; head_sha: string }, r: GateRunRecord, ctx: ToolContext) {
  if (!ctx.connections) throw new ToolError('tool-unavailable', 'connections are not reachable from this run');
  const made: { gate_id: string; check_run_id: unknown; url: unknown }[] = [];
  for (const g of r.results) {
    const annotations = g.annotations
      .filter((x) => x.path)
      .slice(0, 50)
      .map((x) => ({ path: x.path, start_line: x.line ?? 1, annotation_level: x.level, message: x.message, ...(x.title ? { title: x.title } : {}) }));
    const answer = await ctx.connections.act('codehost', 'create_check_run', {
      repository: report.repository,
      head_sha: report.head_sha,
      name: `gate: ${g.gate_id}`,
      conclusion: g.conclusion,
      output: { title: `${g.name}: ${g.conclusion}`, summary: g.summary || g.conclusion, annotations },
    });
    made.push({ gate_id: g.gate_id, check_run_id: answer.check_run_id, url: answer.url });
  }
  return made;
}

export const gatesTool: Tool = {
  name: 'gates',
  description: "Run the workspace's gates (gates.yaml, or those detected) and report each one's conclusion.",
  parameters: {
    type: 'object',
    properties: {
      only: { type: 'array', items: { type: 'string' }, description: 'Run only these gates, by id.' },
      ref: { type: 'string', description: 'The git ref the gates are for (recorded with the step).' },
      check_runs: {
        type: 'object',
        required: ['repository', 'head_sha'],
        properties: { repository: { type: 'string', description: 'owner/name' }, head_sha: { type: 'string' } },
        description: 'Report each gate as a check run on this commit of the code host (the codehost tool must be allowed too).',
      },
    },
  },
  async execute(args, ctx) {
    if (!ctx.gates) throw new ToolError('tool-unavailable', "gates run on a run's own workspace; this run has none they can use");
    const only = Array.isArray(args.only) ? args.only.filter((g): g is string => typeof g === 'string') : undefined;
    // after a checkout the run's steps work in its checkout: the gates run there
    const r = await ctx.gates.run({ only, dir: ctx.workspace }, ctx.signal);
    // ready: every required gate of the set passed in this run; one left out by `only` has not
    const passed = new Set(r.results.filter((g) => g.conclusion === 'success').map((g) => g.gate_id));
    const notRun = (r.required_gates ?? []).filter((id) => !r.results.some((g) => g.gate_id === id));
    const output = {
      gate_run_id: r.id,
      status: r.status,
      ready: r.status === 'succeeded' && (r.required_gates ?? []).every((id) => passed.has(id)),
      ...(notRun.length ? { required_not_run: notRun } : {}),
      results: r.results.map((g) => ({ gate_id: g.gate_id, required: g.required, conclusion: g.conclusion, summary: g.summary })),
      ledger: r.ledger,
      ...(typeof args.ref === 'string' ? { ref: args.ref } : {}),
    };
    for (const g of output.results) ctx.output('stdout', `${g.conclusion.padEnd(9)} ${g.gate_id}${g.required ? '' : ' (optional)'}: ${g.summary}\n`);
    const report = checkRunsOf(args);
    const check_runs = report ? await reportChecks(report, r, ctx) : undefined;
    if (check_runs) Object.assign(output, { check_runs });
    if (r.status === 'canceled' && r.error) return { output: { ...output, error: r.error }, error: { code: 'gates-not-sealed', message: r.error } };
    if (r.status === 'canceled') return { output, error: { code: 'aborted', message: 'the gate run was stopped' } };
    const failed = r.results.filter((g) => g.required && g.conclusion !== 'success').map((g) => g.gate_id);
    if (failed.length) return { output, error: { code: 'gates-failed', message: `required gates did not pass: ${failed.join(', ')}` } };
    return { output };
  },
};
