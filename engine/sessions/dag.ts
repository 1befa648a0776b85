// The task DAG's rules that need no state: what makes a batch of tasks valid (every error at once,
// for one 422), and the DAG order tasks are listed in (topological, ties by creation).
import type { FieldError } from '../platform/index.js';

export type DagNode = { id: string; depends_on: string[]; agent_id?: string | null };

/**
 * Checks new tasks against the session's existing ones: unknown, duplicate and self dependencies,
 * unknown agents, ids used twice, and cycles (a new task may depend on existing tasks, never the other
 * way round, so a cycle can only run through new ones). Paths point into the request's `tasks` list.
 */
export function dagErrors(existing: readonly DagNode[], added: readonly DagNode[], agentIds: ReadonlySet<string>, at = '/body/tasks'): FieldError[] {
  const errors: FieldError[] = [];
  const known = new Set(existing.map((t) => t.id));
  const addedIds = new Map<string, number>();
  added.forEach((t, i) => {
    if (known.has(t.id) || addedIds.has(t.id)) errors.push({ path: `${at}/${i}/id`, message: `task id ${t.id} is used twice` });
    else addedIds.set(t.id, i);
  });
  added.forEach((t, i) => {
    const seen = new Set<string>();
    t.depends_on.forEach((dep, j) => {
      const path = `${at}/${i}/depends_on/${j}`;
      if (dep === t.id) errors.push({ path, message: 'a task cannot depend on itself' });
      else if (seen.has(dep)) errors.push({ path, message: `${dep} is listed twice` });
      else if (!known.has(dep) && !addedIds.has(dep)) errors.push({ path, message: `no task ${dep} in this session or this request` });
      seen.add(dep);
    });
    if (t.agent_id && !agentIds.has(t.agent_id)) errors.push({ path: `${at}/${i}/agent_id`, message: `no agent ${t.agent_id} in this session` });
  });
  // cycles among the new tasks (Kahn: what cannot be ordered is on or behind a cycle)
  const indegree = new Map<string, number>();
  const dependents = new Map<string, string[]>();
  for (const [i, t] of added.entries()) {
    // a task whose id is used twice is in the graph once, as its first use (a second would hide its edges)
    if (addedIds.get(t.id) !== i) continue;
    const deps = t.depends_on.filter((d) => addedIds.has(d) && d !== t.id);
    indegree.set(t.id, new Set(deps).size);
    for (const d of new Set(deps)) {
      const list = dependents.get(d);
      if (list) list.push(t.id);
      else dependents.set(d, [t.id]);
    }
  }
  const queue = [...indegree].filter(([, n]) => n === 0).map(([id]) => id);
  for (let head = 0; head < queue.length; head++) {
    const id = queue[head]!;
    for (const next of dependents.get(id) ?? []) {
      const n = indegree.get(next)! - 1;
      indegree.set(next, n);
      if (n === 0) queue.push(next);
    }
  }
  const cyclic = [...indegree].filter(([, n]) => n > 0).map(([id]) => id);
  if (cyclic.length) errors.push({ path: at, message: `the dependencies form a cycle through ${cyclic.sort().join(', ')}` });
  return errors;
}

/** Tasks in DAG order: every task after its dependencies; among those ready together, the first added first. */
export function dagOrder<T extends DagNode & { created_at: string; position?: number }>(tasks: readonly T[]): T[] {
  // rank by the order they were added (a task stored before positions existed has none: by its creation,
  // ahead of the rest), then by id; the ready tasks wait in a min-heap of ranks: O(n log n) however wide the DAG
  const ranked = [...tasks].sort((a, b) => (a.position ?? 0) - (b.position ?? 0) || a.created_at.localeCompare(b.created_at) || a.id.localeCompare(b.id));
  const rank = new Map(ranked.map((t, i) => [t.id, i]));
  const indegree = ranked.map((t) => t.depends_on.filter((d) => rank.has(d)).length);
  const dependents: number[][] = ranked.map(() => []);
  ranked.forEach((t, i) => {
    for (const d of t.depends_on) if (rank.has(d)) dependents[rank.get(d)!]!.push(i);
  });
  const heap: number[] = [];
  const push = (r: number) => {
    let i = heap.push(r) - 1;
    while (i > 0 && heap[(i - 1) >> 1]! > heap[i]!) {
      [heap[i], heap[(i - 1) >> 1]] = [heap[(i - 1) >> 1]!, heap[i]!];
      i = (i - 1) >> 1;
    }
  };
  const pop = (): number => {
    const top = heap[0]!;
    const last = heap.pop()!;
    if (heap.length) {
      heap[0] = last;
      for (let i = 0; ;) {
        const l = 2 * i + 1;
        const r = l + 1;
        let m = i;
        if (l < heap.length && heap[l]! < heap[m]!) m = l;
        if (r < heap.length && heap[r]! < heap[m]!) m = r;
        if (m === i) break;
        [heap[i], heap[m]] = [heap[m]!, heap[i]!];
        i = m;
      }
    }
    return top;
  };
  indegree.forEach((n, i) => n === 0 && push(i));
  const out: T[] = [];
  while (heap.length) {
    const i = pop();
    out.push(ranked[i]!);
    for (const next of dependents[i]!) if (--indegree[next]! === 0) push(next);
  }
  return out;
}
