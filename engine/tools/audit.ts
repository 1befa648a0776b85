// audit: the workspace audit of the run's workspace (security, architecture, sanity, health), the
// same flow as the audit routes; waits for the report. With `fail_on`, a finding at that severity or
// worse fails the step (a CI job's gate); a report left partial (a phase that could not run) fails it too.
import { AUDIT_PHASES, SEVERITIES, type AuditLayer, type AuditPhase, type Severity } from '../platform/index.js';
import { ToolError, type Tool } from './tool.js';

export const auditTool: Tool = {
  name: 'audit',
  description: "Audit the run's workspace: secrets and risky scripts, the import graph, manifest and lockfile, TODOs, stale gates and outdated dependencies.",
  parameters: {
    type: 'object',
    properties: {
      phases: { type: 'array', items: { type: 'string', enum: [...AUDIT_PHASES] }, description: 'The phases to run (all four by default).' },
      fail_on: { type: 'string', enum: [...SEVERITIES], description: 'Fail the step when a finding is this severe or worse.' },
      layers: {
        type: 'array',
        description: 'Layering rules: each layer a name, a path regular expression and the layers it may import.',
        items: {
          type: 'object',
          properties: { name: { type: 'string' }, path: { type: 'string' }, may_import: { type: 'array', items: { type: 'string' } } },
          required: ['name', 'path'],
        },
      },
    },
  },
  async execute(args, ctx) {
    if (!ctx.audit) throw new ToolError('tool-unavailable', "the audit reads a run's own workspace; this run has none it can use");
    const phases = Array.isArray(args.phases) ? args.phases.filter((p): p is AuditPhase => (AUDIT_PHASES as readonly unknown[]).includes(p)) : undefined;
    const failOn = (SEVERITIES as readonly unknown[]).includes(args.fail_on) ? (args.fail_on as Severity) : null;
    const report = await ctx.audit.run({ phases, layers: Array.isArray(args.layers) ? (args.layers as AuditLayer[]) : undefined }, ctx.signal);
    const output = {
      report_id: report.report_id,
      status: report.status,
      totals: report.totals,
      scores: report.scores,
      phases: report.phases.map((p) => ({ phase: p.phase, status: p.status, counts: p.counts, score: p.score, error: p.error })),
      ledger: report.ledger,
    };
    for (const p of report.phases)
      ctx.output('stdout', `${p.phase.padEnd(12)} ${p.status.padEnd(9)} score ${p.score ?? '-'}  ${SEVERITIES.map((s) => `${s} ${p.counts[s]}`).join(', ')}\n`);
    if (report.status === 'running') return { output, error: { code: 'aborted', message: 'the audit was stopped before its report' } };
    if (report.status === 'partial')
      return {
        output,
        error: {
          code: 'audit-partial',
          message: `phases did not complete: ${report.phases
            .filter((p) => p.status !== 'completed')
            .map((p) => `${p.phase} (${p.error})`)
            .join('; ')}`,
        },
      };
    if (failOn) {
      const worse = SEVERITIES.slice(0, SEVERITIES.indexOf(failOn) + 1).filter((s) => report.totals[s] > 0);
      if (worse.length)
        return {
          output,
          error: { code: 'audit-findings', message: `findings at ${failOn} or worse: ${worse.map((s) => `${report.totals[s]} ${s}`).join(', ')}` },
        };
    }
    return { output };
  },
};
