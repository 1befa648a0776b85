// Records are not answers: what the API shows of each record. No server paths, no internals.
import type { Run, RunDetail } from '../engine/platform/index.js';

type RunViewOptions = { workspaceOf(run: Run): string };

/** A run as a client sees it: the workspace as it was named (relative to the workspace root). */
export function runView<T extends Run | RunDetail>(run: T, opts: RunViewOptions): T {
  return { ...run, workspace: opts.workspaceOf(run), agent: run.agent ?? null };
}
