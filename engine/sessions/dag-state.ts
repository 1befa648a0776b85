// The task DAG's live state, in Redis, changed only by Lua scripts (DESIGN.md: a BullMQ job has one
// parent, so a DAG is not a flow). Per session, five hashes under one hash tag so every key is in one slot:
//   state  task -> pending | queued | running | succeeded | failed | upstream_failed | canceled
//   need   task -> how many dependencies it has
//   rule   task -> all_success | all_done
//   sat    task -> JSON list of its dependencies already satisfied (a set, not a counter: a replayed
//                  completion cannot release a child twice), while the task is pending
//   kids   task -> JSON list of the tasks that depend on it, until its end has been walked (a task added
//                  later reads an ended dependency's state)
// A completion is first-writer-wins: a task already ended is not ended again, and its dependents are
// released once. A task that has ended never starts again (the fence). Every script that changes a
// session's DAG keeps its five keys DAG_TTL_MS from then: a session's DAG lives as long as it changes, and
// goes after that long without a change. A session's keys lost (expired, or with Redis's data) are rebuilt
// from the store: ADD learns the dependencies that ended, START lets a task it does not know run (its run is
// in the store), and the reconciler registers again a pending task Redis does not know, or whose dependency
// the store has ended and Redis, back from older data, has not.
import { redisBatch, type Redis, type TaskStatus, type TriggerRule } from '../platform/index.js';

/** How long a session's DAG keys outlive the last change of its DAG. */
export const DAG_TTL_MS = 7 * 86_400_000;

const FAILED = `local function failed(s) return s == 'failed' or s == 'upstream_failed' or s == 'canceled' end
local function keep(base)
  for _, k in ipairs({':state', ':need', ':rule', ':sat', ':kids'}) do redis.call('PEXPIRE', base .. k, ${DAG_TTL_MS}) end
end
local function listOf(h, id)
  local v = redis.call('HGET', h, id)
  if v then return cjson.decode(v) end
  return {}
end
-- A task's state, rule and need, read from Redis once a script and kept here, every write of the script's
-- written through: the tasks of a batch share their dependencies, and 450 tasks of 100 dependencies each
-- asked Redis for the same 100 states 900 times over
local known = {state = {}, rule = {}, need = {}}
local function field(base, h, id)
  local v = known[h][id]
  if v == nil then
    v = redis.call('HGET', base .. ':' .. h, id)
    known[h][id] = v
  end
  return v
end
local function put(base, h, id, v)
  redis.call('HSET', base .. ':' .. h, id, v)
  known[h][id] = v
end
-- A task's satisfied dependencies, read from Redis once a script and kept here as a list and a set, and written
-- back once, by flush, at its end: a task of 100 dependencies satisfied one by one decoded, scanned and wrote
-- its list 100 times (a batch of 451 such tasks held Redis 860 ms, every other client waiting)
local sats = {}
local function satOf(base, task)
  local c = sats[task]
  if not c then
    c = {list = listOf(base .. ':sat', task), has = {}, dirty = false}
    for _, y in ipairs(c.list) do c.has[y] = true end
    sats[task] = c
  end
  return c
end
-- adds dep to the task's satisfied dependencies unless it is there already; answers how many it has
local function satisfy(base, task, dep)
  local c = satOf(base, task)
  if not c.has[dep] then
    c.has[dep] = true
    table.insert(c.list, dep)
    c.dirty = true
  end
  return #c.list
end
-- the task waits no longer: its list goes, and what the script added to it is not written
local function unsatisfy(base, task)
  sats[task] = nil
  redis.call('HDEL', base .. ':sat', task)
end
local function flush(base)
  for task, c in pairs(sats) do
    if c.dirty then redis.call('HSET', base .. ':sat', task, cjson.encode(c.list)) end
  end
end`;

// Ends tasks and walks their dependents: all_success dependents of a failure end upstream_failed (and
// theirs after them); a dependent whose every dependency is satisfied becomes queued.
const WALK = `${FAILED}
local function walk(base, queue, ready, upstream)
  local i = 1
  while i <= #queue do
    local done = queue[i]
    local outcome = field(base, 'state', done)
    for _, kid in ipairs(listOf(base .. ':kids', done)) do
      if field(base, 'state', kid) == 'pending' then
        local rule = field(base, 'rule', kid)
        if outcome == 'succeeded' or rule == 'all_done' then
          if satisfy(base, kid, done) >= tonumber(field(base, 'need', kid)) then
            put(base, 'state', kid, 'queued')
            unsatisfy(base, kid)
            table.insert(ready, kid)
          end
        elseif failed(outcome) then
          put(base, 'state', kid, 'upstream_failed')
          unsatisfy(base, kid)
          table.insert(upstream, kid)
          table.insert(queue, kid)
        end
      end
    end
    redis.call('HDEL', base .. ':kids', done)
    i = i + 1
  end
end`;

// ARGV[1]: JSON [{id, deps, rule}]. Registers the tasks Redis does not know yet (adding one again, as the
// reconciler does for a task whose registration was cut off, registers nothing again), satisfies their
// dependencies that already ended (a known task that waits, too), and answers {ready, upstream_failed}. ARGV[2]: JSON [{id, state}], their
// dependencies that have ended in the store: what Redis does not know of them it learns first, so a
// dependency that ended before Redis lost its data still satisfies, or fails, its dependents. Lost, or
// older: Redis back from an older save (or a replica behind) may hold such a dependency as not ended, and its
// end, which the store has, will not come again. It ends now, and its dependents registered before are walked.
const ADD = `${WALK}
local base = KEYS[1]
local tasks = cjson.decode(ARGV[1])
local ready, upstream, queue, new = {}, {}, {}, {}
for _, e in ipairs(cjson.decode(ARGV[2])) do
  local s = field(base, 'state', e.id)
  if not (s == 'succeeded' or failed(s)) then
    put(base, 'state', e.id, e.state)
    unsatisfy(base, e.id)
    table.insert(queue, e.id)
  end
end
-- the new dependents of each dependency that has not ended, written once a dependency
local kids, order = {}, {}
for _, t in ipairs(tasks) do
  if redis.call('HSETNX', base .. ':state', t.id, 'pending') == 1 then
    known.state[t.id] = 'pending'
    put(base, 'need', t.id, #t.deps)
    put(base, 'rule', t.id, t.rule)
    for _, d in ipairs(t.deps) do
      local s = field(base, 'state', d)
      if not (s == 'succeeded' or failed(s)) then
        if not kids[d] then
          kids[d] = listOf(base .. ':kids', d)
          table.insert(order, d)
        end
        table.insert(kids[d], t.id)
      end
    end
    table.insert(new, t)
  end
end
for _, d in ipairs(order) do redis.call('HSET', base .. ':kids', d, cjson.encode(kids[d])) end
-- every task given that waits, new or known (the reconciler's), is judged by its dependencies' states as
-- they are now: one whose release the walk of an ended dependency would have made is made here
for _, t in ipairs(tasks) do
  if field(base, 'state', t.id) == 'pending' then
    for _, d in ipairs(t.deps) do
      local s = field(base, 'state', d)
      if s == 'succeeded' or (t.rule == 'all_done' and failed(s)) then
        satisfy(base, t.id, d)
      elseif failed(s) and field(base, 'state', t.id) == 'pending' then
        put(base, 'state', t.id, 'upstream_failed')
        table.insert(upstream, t.id)
        table.insert(queue, t.id)
      end
    end
    if field(base, 'state', t.id) == 'pending' and #satOf(base, t.id).list >= #t.deps then
      put(base, 'state', t.id, 'queued')
      table.insert(ready, t.id)
    end
    if field(base, 'state', t.id) ~= 'pending' then unsatisfy(base, t.id) end
  end
end
walk(base, queue, ready, upstream)
flush(base)
keep(base)
return {ready, upstream}`;

// ARGV[1]: the task, ARGV[2]: how it ended. Answers {ready, upstream_failed}, or nothing when it had ended already.
// A task Redis does not know (its data lost since the task started: START let it run) ends too: its
// dependents registered since are released, and a late duplicate of its run is fenced.
const COMPLETE = `${WALK}
local base = KEYS[1]
local s = field(base, 'state', ARGV[1])
if s == 'succeeded' or (s and failed(s)) then return false end
put(base, 'state', ARGV[1], ARGV[2])
local ready, upstream = {}, {}
walk(base, {ARGV[1]}, ready, upstream)
flush(base)
keep(base)
return {ready, upstream}`;

// The fence: queued or running (another attempt, or a run after an answer) -> running, 1; a task
// that has ended answers 0 and is not run again. A task Redis does not know (its keys were lost)
// answers 1: the store is the truth, and its run is already there.
const START = `${FAILED}
local s = redis.call('HGET', KEYS[1] .. ':state', ARGV[1])
if s == 'succeeded' or failed(s) then return 0 end
if s then
  redis.call('HSET', KEYS[1] .. ':state', ARGV[1], 'running')
  keep(KEYS[1])
end
return 1`;

export type DagChange = { ready: string[]; upstreamFailed: string[] };

export function dagStateOf(redis: Redis, prefix: string) {
  // in the engine's Redis batch: a task's fence and its completion share their round trip with the
  // run's events and tenant slot, and with what other runs ask for in the same turn
  const batch = redisBatch(redis);
  batch.define('dag.add', { keys: 1, args: 2, lua: ADD });
  batch.define('dag.complete', { keys: 1, args: 2, lua: COMPLETE });
  batch.define('dag.start', { keys: 1, args: 1, lua: START });
  const base = (sessionId: string) => `${prefix}:dag:{${sessionId}}`;
  return {
    /** Registers tasks; `ended` are their dependencies that have ended in the store (Redis may have lost them). */
    async add(
      sessionId: string,
      tasks: { id: string; depends_on: string[]; trigger_rule: TriggerRule }[],
      ended: { id: string; status: TaskStatus }[] = [],
    ): Promise<DagChange> {
      const [ready, upstreamFailed] = await batch.call<[string[], string[]]>(
        'dag.add',
        [base(sessionId)],
        [
          JSON.stringify(tasks.map((t) => ({ id: t.id, deps: t.depends_on, rule: t.trigger_rule }))),
          JSON.stringify(ended.map((t) => ({ id: t.id, state: t.status }))),
        ],
      );
      return { ready, upstreamFailed };
    },
    async complete(sessionId: string, taskId: string, outcome: Extract<TaskStatus, 'succeeded' | 'failed' | 'canceled'>): Promise<DagChange | null> {
      const res = await batch.call<[string[], string[]] | null>('dag.complete', [base(sessionId)], [taskId, outcome]);
      return res ? { ready: res[0], upstreamFailed: res[1] } : null;
    },
    /** A task's state in Redis, or null when Redis does not know it (lost, or never added). */
    async stateOf(sessionId: string, taskId: string): Promise<string | null> {
      return redis.hget(`${base(sessionId)}:state`, taskId);
    },
    async start(sessionId: string, taskId: string): Promise<boolean> {
      return (await batch.call<number>('dag.start', [base(sessionId)], [taskId])) === 1;
    },
  };
}

export type DagState = ReturnType<typeof dagStateOf>;
