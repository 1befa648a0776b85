// express-openapi-validator 5.6 finds a request's operation by compiling the path-to-regexp matcher of
// every route of the spec, on every request, and throwing them away (an open upstream pull request,
// cdimascio/express-openapi-validator#1217, caches them). Compiling is most of that lookup. Until the
// fix is released, the module the validator calls keeps what it compiled: a matcher depends only on the
// route and the two options the validator passes, and the validator only executes it (a RegExp without
// the g or y flag keeps no state between calls). The routes are the spec's: the memo is bounded by it.
import { createRequire } from 'node:module';
import path from 'node:path';

type Compile = (route: string, options?: { sensitive?: boolean; strict?: boolean }) => unknown;

const require = createRequire(import.meta.url);

/** The path-to-regexp module express-openapi-validator requires (its own copy, if it has one). */
function validatorsPathToRegexp(): { pathToRegexp: Compile } {
  const validator = path.dirname(require.resolve('express-openapi-validator'));
  return require(require.resolve('path-to-regexp', { paths: [validator] })) as { pathToRegexp: Compile };
}

const MEMOIZED = Symbol.for('automation-service.memoized');

/** Makes the validator's route lookup reuse compiled matchers; idempotent. Returns the memo, for tests. */
export function memoizeRouteMatchers(): Map<string, unknown> {
  const mod = validatorsPathToRegexp();
  const current = mod.pathToRegexp as Compile & { [MEMOIZED]?: Map<string, unknown> };
  if (current[MEMOIZED]) return current[MEMOIZED];
  const compile = current;
  const memo = new Map<string, unknown>();
  const memoized: Compile & { [MEMOIZED]?: Map<string, unknown> } = (route, options) => {
    // only the shape the validator passes: a string and the two routing flags
    const keys = options ? Object.keys(options) : [];
    if (typeof route !== 'string' || keys.some((k) => k !== 'sensitive' && k !== 'strict')) return compile(route, options);
    const key = `${options?.sensitive ? 1 : 0}${options?.strict ? 1 : 0}${route}`;
    let found = memo.get(key);
    if (found === undefined) memo.set(key, (found = compile(route, options)));
    return found;
  };
  memoized[MEMOIZED] = memo;
  mod.pathToRegexp = memoized;
  return memo;
}
