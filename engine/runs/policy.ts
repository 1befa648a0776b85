// What the operator lets tenants do: which tools at all (SERVICE_TOOLS_ALLOWED; a run's or an
// automation's allowlist can only narrow it) and whether tool processes may use the network
// (SERVICE_SANDBOX_ALLOW_NETWORK). Asking for more is a 403 that names what was refused. Work that needs
// the agent endpoint while none is configured is a 422.
import { AgentNotConfiguredError, DEFAULT_AGENT_TOOLS, NotPermittedError, type Step, type ToolName } from '../platform/index.js';

export type ToolPolicy = { toolsAllowed: readonly ToolName[]; allowNetwork: boolean };

/**
 * The allowlist of a run or an automation: the one asked for, else the tools of its steps, else the
 * agent's default tools (those of them the operator allows). Refused when it names a tool the operator does not allow.
 */
export function allowlistOf(policy: ToolPolicy, asked: readonly string[] | undefined, steps: Step[] | null, at: string): ToolName[] {
  const list = (asked ?? (steps ? [...new Set(steps.map((s) => s.tool))] : DEFAULT_AGENT_TOOLS.filter((t) => policy.toolsAllowed.includes(t)))) as ToolName[];
  const refused = list.filter((t) => !policy.toolsAllowed.includes(t));
  if (refused.length) {
    throw new NotPermittedError(
      'tool-not-permitted',
      `the operator does not allow ${refused.join(', ')} (SERVICE_TOOLS_ALLOWED: ${policy.toolsAllowed.join(', ')})`,
      {
        tools: refused,
        at,
      },
    );
  }
  return list;
}

/** Network for a run's tool processes: only when asked for and allowed. */
export function networkOf(policy: ToolPolicy, asked: boolean | undefined): boolean {
  if (asked && !policy.allowNetwork) {
    throw new NotPermittedError('network-not-permitted', 'this service does not let runs use the network (SERVICE_SANDBOX_ALLOW_NETWORK is not set)');
  }
  return asked === true;
}

/**
 * Work that needs the agent endpoint (a goal, no steps, or an `agent` step) is refused when none is
 * configured: a run, a session's task or an automation (whose every fire would fail). `what` names it.
 */
export function requireAgentFor(settings: { agent?: unknown }, steps: readonly Step[] | null | undefined, what: string): void {
  const planned = steps?.length ? steps : null;
  if ((!planned || planned.some((s) => s.tool === 'agent')) && !settings.agent)
    throw new AgentNotConfiguredError(
      `${what} ${planned ? 'has an agent step' : 'names a goal and no steps'}, and no agent endpoint is configured (SERVICE_AGENT_BASE_URL, SERVICE_AGENT_MODEL)`,
    );
}
