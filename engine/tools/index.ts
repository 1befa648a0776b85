// The tools a step may call, by name. `agent` is handled by the executor itself (it plans steps);
// `gates`, `audit` and `session` act through what the engine gives a run (ToolContext).
import { listFilesTool, readFileTool, writeFileTool } from './files.js';
import { gatesTool } from './gates.js';
import { auditTool } from './audit.js';
import { httpTool } from './http.js';
import { messageTool } from './message.js';
import { PROVIDER_TOOLS } from './providers.js';
import { sessionTool } from './session.js';
import { shellTool } from './shell.js';
import type { Tool } from './tool.js';

export const TOOLS: ReadonlyMap<string, Tool> = new Map(
  [shellTool, readFileTool, writeFileTool, listFilesTool, httpTool, messageTool, sessionTool, gatesTool, auditTool, ...PROVIDER_TOOLS].map((t) => [t.name, t]),
);

export { resolveInside } from './files.js';
export { INSIDE_WORKSPACE, openSandbox, which, type Sandbox, type SandboxKind, type SandboxLimits } from './sandbox.js';
export { runProcess, type ProcessResult } from './process.js';
export {
  envArg,
  ToolError,
  textOf,
  type AuditActions,
  type ConnectionActions,
  type GateActions,
  type GitAccess,
  type OwnSession,
  type SessionActions,
  type StepConnections,
  type Tool,
  type ToolContext,
  type ToolResult,
} from './tool.js';
