// The OpenAPI file is the contract: it lints clean, every operation is complete, every operation
// answers on a route (no operation exists only on paper), and every route is an operation.
import { spawnSync } from 'node:child_process';
import { readdirSync, readFileSync } from 'node:fs';
import { expect } from 'chai';
import { loadSpec } from '../../api/spec.js';
import { startHarness } from '../support/harness.js';

const METHODS = ['get', 'post', 'put', 'patch', 'delete'] as const;

type Operation = { operationId?: string; responses?: Record<string, { $ref?: string; content?: Record<string, unknown> }> };

function operations(): { method: string; path: string; op: Operation }[] {
  const spec = loadSpec();
  const out: { method: string; path: string; op: Operation }[] = [];
  for (const [path, item] of Object.entries(spec.paths)) {
    for (const m of METHODS) {
      const op = (item as Record<string, Operation>)[m];
      if (op) out.push({ method: m.toUpperCase(), path, op });
    }
  }
  return out;
}

describe('api/openapi.yaml', function () {
  this.timeout(60_000);

  it('passes the Redocly linter with no errors or warnings', () => {
    const run = spawnSync('node_modules/.bin/redocly', ['lint', 'api/openapi.yaml', '--format', 'stylish'], { encoding: 'utf8' });
    const out = run.stdout + run.stderr;
    expect(run.status, out).to.equal(0);
    expect(out).to.contain('Your API description is valid');
    expect(out).not.to.match(/\d+ warnings?\b|\d+ errors?\b/i);
  });

  it('gives every operation a unique operationId and problem+json errors', () => {
    const ids = operations().map((o) => o.op.operationId);
    expect(ids.every(Boolean)).to.equal(true);
    expect(new Set(ids).size).to.equal(ids.length);
    const spec = loadSpec() as unknown as { components: { responses: Record<string, { content?: Record<string, unknown> }> } };
    for (const { method, path, op } of operations()) {
      for (const [status, response] of Object.entries(op.responses ?? {})) {
        if (Number(status) < 400 || path === '/readyz') continue; // readiness answers its checks as JSON
        const resolved = response.$ref ? spec.components.responses[response.$ref.split('/').pop()!] : response;
        expect(Object.keys(resolved?.content ?? {}), `${method} ${path} ${status}`).to.include('application/problem+json');
      }
    }
  });

  it('matches the handler types generated from it (npm run gen:types)', () => {
    const run = spawnSync('node_modules/.bin/openapi-typescript', ['api/openapi.yaml'], { encoding: 'utf8' });
    expect(run.status, run.stderr).to.equal(0);
    expect(run.stdout.trim(), 'api/schema.d.ts is stale: run npm run gen:types').to.equal(readFileSync('api/schema.d.ts', 'utf8').trim());
  });

  it('has a route for every operation', async () => {
    const h = await startHarness();
    try {
      for (const { method, path } of operations()) {
        const concrete = path.replace('{id}', 'aut_00000000000000000000000000');
        // an audit route answers 403 for /etc before it starts anything (it would otherwise run an audit)
        const headers: Record<string, string> = path.includes('workspace-audit') ? { 'x-service-workspace-root': '/etc' } : {};
        const res = await h.call(method, concrete, { body: method === 'GET' || method === 'DELETE' ? undefined : {}, headers });
        // Reaching the handler (or the validator's body check) shows the route exists; an unrouted
        // operation would end in the catch-all "no route" 404 or a 405.
        expect(res.status, `${method} ${path}: ${res.text}`).not.to.equal(405);
        if (res.status === 404) expect(res.body.detail, `${method} ${path}`).not.to.match(/^no route|not found$/);
      }
    } finally {
      await h.close();
    }
  });

  it('has an operation for every route (read from the routers’ source: where each is mounted, and its routes)', () => {
    // routes that are not the API's operations: the docs pages' own script and bundle, and the admin's metrics
    const NOT_OPERATIONS = new Set(['GET /docs/init.js', 'GET /redoc/redoc.standalone.js', 'GET /metrics']);
    const app = readFileSync('api/app.ts', 'utf8');
    const mounts = new Map<string, string[]>(); // a router factory's name: the prefixes it is mounted at
    for (const [, prefix, name] of app.matchAll(/app\.use\((?:'([^']*)', )?(\w+Router)\(/g)) mounts.set(name!, [...(mounts.get(name!) ?? []), prefix ?? '']);
    const routes: string[] = [...app.matchAll(/app\.(get|post|put|patch|delete)\('([^']+)'/g)].map(([, m, p]) => `${m!.toUpperCase()} ${p}`);
    const files = ['api/admin.ts', 'api/docs.ts', 'api/sign-in.ts', ...readdirSync('api/routes').map((f) => `api/routes/${f}`)];
    for (const file of files) {
      // each exported router factory, with the routes declared in its body (up to the next factory)
      const text = readFileSync(file, 'utf8');
      const factories = [...text.matchAll(/export function (\w+Router)\(/g)];
      factories.forEach((f, i) => {
        const body = text.slice(f.index, factories[i + 1]?.index ?? text.length);
        const prefixes = mounts.get(f[1]!);
        expect(prefixes, `${f[1]} (${file}) is mounted in api/app.ts`).to.not.equal(undefined);
        for (const [, m, p] of body.matchAll(/router\.(get|post|put|patch|delete)\('([^']+)'/g))
          for (const prefix of prefixes!) routes.push(`${m!.toUpperCase()} ${(prefix + p).replace(/(.)\/$/, '$1')}`);
      });
    }
    expect(routes.length, 'routes found').to.be.greaterThan(60);
    const documented = operations().map(({ method, path }) => `${method} ${path.replace(/\{[^}]+\}/g, 'x')}`);
    const undocumented = routes.filter((route) => {
      if (NOT_OPERATIONS.has(route)) return false;
      const [method, path] = route.split(' ') as [string, string];
      const pattern = new RegExp(`^${method} ${path.replace(/:\w+/g, '[^/]+')}$`);
      return !documented.some((op) => pattern.test(op));
    });
    expect(undocumented, 'routes with no operation in api/openapi.yaml').to.deep.equal([]);
  });
});
