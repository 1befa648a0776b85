import { expect } from 'chai';
import { startHarness } from '../support/harness.js';

describe('documentation routes', () => {
  it('serves /openapi.json, /docs and /redoc outside production, from local files', async () => {
    const h = await startHarness();
    try {
      const spec = await h.call('GET', '/openapi.json', { key: null });
      expect(spec.status).to.equal(200);
      expect(spec.body.openapi).to.equal('3.1.0');
      expect(spec.body.paths).to.have.property('/api/v1/automations');
      const docs = await h.call('GET', '/docs', { key: null });
      expect(docs.status).to.equal(200);
      expect(docs.text)
        .to.contain('/docs/assets/swagger-ui-bundle.js')
        .and.not.match(/https?:\/\/(?!localhost)/);
      expect((await h.call('GET', '/docs/assets/swagger-ui-bundle.js', { key: null })).status).to.equal(200);
      // only what the page loads: not the package's demo page, whose initializer loads the Petstore's spec
      for (const other of ['index.html', 'swagger-initializer.js', 'swagger-ui-bundle.js.map'])
        expect((await h.call('GET', `/docs/assets/${other}`, { key: null })).status, other).to.equal(404);
      for (const page of ['/docs', '/redoc']) {
        const res = await h.call('GET', page, { key: null });
        expect(res.headers.get('x-frame-options'), page).to.equal('DENY');
        expect(res.headers.get('content-security-policy'), page).to.contain("frame-ancestors 'none'");
      }
      const redoc = await h.call('GET', '/redoc', { key: null });
      expect(redoc.status).to.equal(200);
      expect(redoc.text).to.contain('/redoc/redoc.standalone.js').and.contain('spec-url="/openapi.json"');
      expect((await h.call('GET', '/redoc/redoc.standalone.js', { key: null })).status).to.equal(200);
    } finally {
      await h.close();
    }
  });

  it('answers 404 for all three in production', async () => {
    const h = await startHarness({
      env: { NODE_ENV: 'production', SERVICE_STORE: 'sqlite', SERVICE_SECRET_KEY: 'ab'.repeat(32), SERVICE_EVIDENCE_KEY: 'cd'.repeat(32) },
    });
    try {
      for (const p of ['/openapi.json', '/docs', '/redoc', '/redoc/redoc.standalone.js', '/docs/assets/swagger-ui-bundle.js']) {
        const res = await h.call('GET', p, { key: null });
        expect(res.status, p).to.equal(404);
        expect(res.headers.get('content-type')).to.contain('application/problem+json');
      }
      expect((await h.call('GET', '/api/v1/automations')).status).to.equal(200);
    } finally {
      await h.close();
    }
  });
});
