// One round trip for the engine's own Redis work of one turn of the event loop. Capabilities define
// small Lua operations (append an event, take or free a tenant slot, read a flag); every operation
// asked for in one turn, by any run or request, goes to Redis in one script call, in the order it was
// asked. A turn ends after the I/O callbacks of one pass of the loop (the call is sent from
// setImmediate): the requests a web process reads in one pass, each in its own callback, share the
// call. On a busy process that is one socket write where there were several per run or request: each
// write is a system call, and those were the largest single cost. Every key carries the queue prefix,
// so on a Redis Cluster (whose prefix has a hash tag) the keys of one call share a slot.
import type { Redis } from './redis.js';

/** An operation: how many keys and arguments it takes, and its Lua body, which sees `KEYS` and `ARGV` tables of its own and returns a value (not nil). */
export type BatchOp = { keys: number; args: number; lua: string };

export type RedisBatch = {
  /** Defines an operation; the same name defined twice must be the same operation. */
  define(name: string, op: BatchOp): void;
  /** Asks for an operation; it is sent with the rest of this turn's, and answers with its own result. */
  call<T>(name: string, keys: string[], args: (string | number)[]): Promise<T>;
};

/** At most this many operations go in one script call, so that one call never holds Redis for long. */
const BATCH_MAX = 256;

const batches = new WeakMap<Redis, RedisBatch>();

/** The batch of a connection: its users share it, so their operations share its round trips. */
export function redisBatch(redis: Redis): RedisBatch {
  let batch = batches.get(redis);
  if (!batch) batches.set(redis, (batch = makeBatch(redis)));
  return batch;
}

type Pending = { name: string; keys: string[]; args: (string | number)[]; resolve(v: unknown): void; reject(err: unknown): void };
type Runner = Redis & Record<string, (numKeys: number, ...argv: (string | number)[]) => Promise<unknown[]>>;

function makeBatch(redis: Redis): RedisBatch {
  const ops = new Map<string, BatchOp>();
  let command: string | null = null;
  let version = 0;
  let pending: Pending[] = [];

  /** The script: ARGV[1] is the number of operations, then their names, then their arguments in order. */
  function scriptOf(): string {
    const defs = [...ops].map(([name, op]) => `[${JSON.stringify(name)}] = { nk = ${op.keys}, na = ${op.args}, f = function(KEYS, ARGV)\n${op.lua}\nend }`);
    return `local defs = {\n${defs.join(',\n')}\n}
local n = tonumber(ARGV[1])
local ki, ai = 1, n + 2
local out = {}
for i = 1, n do
  local d = defs[ARGV[i + 1]]
  local k, a = {}, {}
  for j = 1, d.nk do k[j] = KEYS[ki]; ki = ki + 1 end
  for j = 1, d.na do a[j] = ARGV[ai]; ai = ai + 1 end
  out[i] = d.f(k, a)
end
return out`;
  }

  function commandName(): string {
    if (!command) {
      command = `engineBatch${++version}`;
      redis.defineCommand(command, { lua: scriptOf() });
    }
    return command;
  }

  function flush(): void {
    const items = pending;
    pending = [];
    const name = commandName();
    for (let i = 0; i < items.length; i += BATCH_MAX) {
      const part = items.slice(i, i + BATCH_MAX);
      const keys = part.flatMap((p) => p.keys);
      const argv = [part.length, ...part.map((p) => p.name), ...part.flatMap((p) => p.args)];
      (redis as Runner)[name]!(keys.length, ...keys, ...argv).then(
        (results) => part.forEach((p, j) => p.resolve(results[j])),
        (err: unknown) => part.forEach((p) => p.reject(err)),
      );
    }
  }

  return {
    define(name, op) {
      const known = ops.get(name);
      if (known) {
        if (known.lua !== op.lua || known.keys !== op.keys || known.args !== op.args) throw new Error(`batch operation ${name} is defined twice, differently`);
        return;
      }
      ops.set(name, op);
      command = null; // the next flush defines the script again, with this operation
    },
    call<T>(name: string, keys: string[], args: (string | number)[]): Promise<T> {
      const op = ops.get(name);
      if (!op) return Promise.reject(new Error(`no batch operation ${name}`));
      if (keys.length !== op.keys || args.length !== op.args)
        return Promise.reject(new Error(`batch operation ${name} takes ${op.keys} keys and ${op.args} arguments`));
      return new Promise<T>((resolve, reject) => {
        if (pending.push({ name, keys, args, resolve: resolve as (v: unknown) => void, reject }) === 1) setImmediate(flush);
      });
    },
  };
}
