// Records are not answers: what the API shows of each record. No server paths, no internals.
import type { Run, RunDetail } from '../engine/platform/index.js';

type RunViewOptions = { workspaceOf(run: Run): string };

/** A run as a client sees it: the workspace as it was named (relative to the workspace root). */
export function runView<T extends Run | RunDetail>(run: T, opts: RunViewOptions): T {
  return { ...run, workspace: opts.workspaceOf(run), agent: run.agent ?? null };
}

/** A run in a list: as runView, without an agent's conversation (GET /runs/{id} has it). */
export function runListView(run: Run, opts: RunViewOptions): Run {
  const view = runView(run, opts);
  if (!view.result?.conversation) return view;
  const { conversation: _, ...result } = view.result;
  return { ...view, result };
}
