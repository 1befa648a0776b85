// The validator's route lookup reuses compiled matchers (api/route-matchers.ts): the memo holds the
// spec's routes, never a request's path, and each request still gets its own path parameters.
import { createRequire } from 'node:module';
import path from 'node:path';
import { expect } from 'chai';
import { memoizeRouteMatchers } from '../../api/route-matchers.js';
import { startHarness, type Harness } from '../support/harness.js';

const require = createRequire(import.meta.url);
const validatorsPathToRegexp = () =>
  (
    require(require.resolve('path-to-regexp', { paths: [path.dirname(require.resolve('express-openapi-validator'))] })) as {
      pathToRegexp: (r: string, o?: object) => { regexp: RegExp; keys: { name: string }[] };
    }
  ).pathToRegexp;

describe('route matchers of the request validator', function () {
  let h: Harness;
  before(async () => {
    h = await startHarness({ workers: false });
  });
  after(async () => h?.close());

  it('compiles each route once: the same matcher comes back for the same route and options, another for other options', () => {
    const compile = validatorsPathToRegexp();
    const a = compile('/api/v1/runs/:id', { sensitive: false, strict: false });
    expect(compile('/api/v1/runs/:id', { sensitive: false, strict: false })).to.equal(a);
    expect(compile('/api/v1/runs/:id', { sensitive: true, strict: false })).not.to.equal(a);
    expect(a.regexp.exec('/api/v1/runs/run_1')?.[1]).to.equal('run_1');
    expect(memoizeRouteMatchers(), 'memoizing twice keeps one memo').to.equal(memoizeRouteMatchers());
  });

  it("routes every request with its own parameters, and keeps only the spec's routes", async () => {
    for (const id of ['run_aaaaaaaaaaaaaaaaaaaaaaaaaa', 'run_bbbbbbbbbbbbbbbbbbbbbbbbbb']) {
      const res = await h.call('GET', `/api/v1/runs/${id}`);
      expect(res.status, res.text).to.equal(404);
      expect(res.body.detail).to.equal(`no run ${id}`);
    }
    const bad = await h.call('GET', '/api/v1/automations?limit=0');
    expect(bad.status).to.equal(400);
    const routes = [...memoizeRouteMatchers().keys()].map((k) => k.slice(2));
    expect(routes).to.include('/api/v1/runs/:id');
    expect(routes.some((r) => r.includes('run_'))).to.equal(false);
  });
});
