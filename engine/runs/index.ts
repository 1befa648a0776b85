// Runs: one execution of work of any kind. transitions.ts is the only code that changes a run's
// status; the executor runs one attempt with one program per kind of work (steps, agent, vibe);
// tenant concurrency lives in Redis; workspaces are resolved inside the workspace root.
export { AgentError, type AgentEndpoint } from './agent.js';
export { createTenantSlots, type TenantSlots } from './concurrency.js';
export { executorOf, type Executor } from './executor.js';
export { allowlistOf, networkOf, requireAgentFor, type ToolPolicy } from './policy.js';
export { retryPolicyOf } from './retry.js';
export {
  budgetTooLong,
  CLAIM_WAIT_MS,
  fingerprintOf,
  IDEMPOTENCY_CLAIM_SECONDS,
  IDEMPOTENCY_TTL_SECONDS,
  keyInUse,
  keyReused,
  runsOf,
  serviceKey,
  type RunLimits,
  type RunRequest,
  type Runs,
  type RunSettings,
  type RunsDeps,
} from './runs.js';
export { REDIS_DEADLINE_MS, sessionStream, transitionsOf, type RunFinishedHook, type StartVerdict, type Transitions } from './transitions.js';
export { resolveWorkspace, tenantRoot, tenantRootPath } from './workspace.js';
