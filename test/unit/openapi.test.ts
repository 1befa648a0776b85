// The OpenAPI file is the contract: it lints clean, every operation is complete, and every
// operation answers on a route (no operation exists only on paper).
import { spawnSync } from 'node:child_process';
import { readFileSync } from 'node:fs';
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
});
