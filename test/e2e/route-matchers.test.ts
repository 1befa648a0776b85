// The validator's route lookup walks routes compiled once (api/route-matchers.ts): it answers what the
// validator's own lookup answers (each request its own path parameters, 404, 405 with Allow, 400 for a
// malformed escape, the most specific route first) and compiles the spec's routes once per app.
import { expect } from 'chai';
import { fastRouteLookup } from '../../api/route-matchers.js';
import { startHarness, type Harness } from '../support/harness.js';

describe('route lookup of the request validator', function () {
  let h: Harness;
  before(async () => {
    h = await startHarness({ workers: false });
  });
  after(async () => h?.close());

  it('routes every request with its own parameters, and compiles the routes once', async () => {
    expect(fastRouteLookup(), 'replacing twice keeps one lookup').to.equal(fastRouteLookup());
    await h.call('GET', '/api/v1/automations');
    const compiled = fastRouteLookup().tablesCompiled;
    expect(compiled, 'the validator walks the compiled table').to.be.greaterThan(0);
    for (const id of ['run_aaaaaaaaaaaaaaaaaaaaaaaaaa', 'run_bbbbbbbbbbbbbbbbbbbbbbbbbb']) {
      const res = await h.call('GET', `/api/v1/runs/${id}`);
      expect(res.status, res.text).to.equal(404);
      expect(res.body.detail).to.equal(`no run ${id}`);
    }
    expect(fastRouteLookup().tablesCompiled, 'no table compiled per request').to.equal(compiled);
  });

  it('takes a static route before a parameter at the same place', async () => {
    // /automations/templates is its own operation, not /automations/{id} with the id "templates"
    const res = await h.call('GET', '/api/v1/automations/templates');
    expect(res.status, res.text).to.equal(200);
  });

  it('answers 405 with the methods the path has, 404 for no route, 400 for a malformed escape', async () => {
    const put = await h.call('PUT', '/api/v1/automations');
    expect(put.status).to.equal(405);
    // HEAD too: it is served wherever GET is
    expect(put.headers.get('allow')?.split(', ').sort()).to.deep.equal(['GET', 'HEAD', 'POST']);
    const onPost = await h.call('GET', '/api/v1/autonomy/run');
    expect(onPost.status).to.equal(405);
    expect(onPost.headers.get('allow'), 'no GET, no HEAD').to.equal('POST');
    expect((await h.call('GET', '/api/v1/nothing-here')).status).to.equal(404);
    const malformed = await h.call('GET', '/api/v1/runs/%E0%A4%A');
    expect(malformed.status, malformed.text).to.equal(400);
  });
});
