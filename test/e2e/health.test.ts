import path from 'node:path';
import Database from 'better-sqlite3';
import { expect } from 'chai';
import { startHarness } from '../support/harness.js';

describe('health', () => {
  it('answers /healthz and /readyz without a key while Redis and the store answer', async () => {
    const h = await startHarness();
    try {
      const live = await h.call('GET', '/healthz', { key: null });
      expect(live.status).to.equal(200);
      expect(live.body).to.deep.equal({ status: 'ok' });
      // a path of the spec outside the API asked with a method it does not have: 405 with Allow, as the API's paths
      for (const [method, path, allow] of [
        ['PATCH', '/healthz', 'GET, HEAD'],
        ['DELETE', '/openapi.json', 'GET, HEAD'],
        ['POST', '/readyz/', 'GET, HEAD'],
        // any case, as the path's GET is served
        ['PUT', '/HealthZ', 'GET, HEAD'],
      ] as const) {
        const refused = await h.call(method, path, { key: null });
        expect(refused.status, `${method} ${path}`).to.equal(405);
        expect(refused.headers.get('allow')).to.equal(allow);
        expect(refused.headers.get('content-type')).to.match(/^application\/problem\+json/);
        expect(refused.body.code).to.equal('method-not-allowed');
      }
      expect((await h.call('PATCH', '/no-such-path', { key: null })).status).to.equal(404);
      // sign-in is not configured here: its paths are none of the service's, whatever the method
      expect((await h.call('POST', '/auth/login', { key: null })).status).to.equal(404);
      const callback = await h.call('GET', '/auth/callback?code=x&state=y', { key: null });
      expect([callback.status, callback.body.code]).to.deep.equal([404, 'not-found']);
      const ready = await h.call('GET', '/readyz', { key: null });
      expect(ready.status).to.equal(200);
      expect(ready.body.status).to.equal('ready');
      expect(ready.body.checks.redis.ok).to.equal(true);
      expect(ready.body.checks.store.ok).to.equal(true);
    } finally {
      await h.close();
    }
  });

  it('answers /readyz 503 when Redis is unreachable, and /healthz still 200', async () => {
    const h = await startHarness();
    try {
      h.rt.redis.disconnect(); // no reconnect: the connection is gone as if Redis died
      const ready = await h.call('GET', '/readyz', { key: null });
      expect(ready.status).to.equal(503);
      expect(ready.body.status).to.equal('unavailable');
      expect(ready.body.checks.redis.ok).to.equal(false);
      // in short to anyone; the driver's message, which may name hosts, in the log
      expect(ready.body.checks.redis.error).to.be.oneOf(['no answer within 1 s', 'failed; the log says why']);
      expect(h.logs.join('\n')).to.contain('readiness check failed');
      expect(ready.body.checks.store.ok).to.equal(true);
      expect((await h.call('GET', '/healthz', { key: null })).status).to.equal(200);
    } finally {
      await h.close();
    }
  });

  it('answers /readyz 503 while the store takes no write (another process holds its write lock), and 200 once it does', async () => {
    const h = await startHarness({ workers: false });
    const other = new Database(path.join(h.config.dataDir, 'service.sqlite'));
    try {
      other.exec('BEGIN IMMEDIATE');
      // reads still answer (a SELECT passed here), but nothing can be stored
      const held = await h.call('GET', '/readyz', { key: null });
      expect(held.status).to.equal(503);
      expect(held.body.checks.store).to.deep.include({ ok: false, error: 'no answer within 1 s' });
      expect(held.body.checks.redis.ok).to.equal(true);
      other.exec('COMMIT');
      const ready = await h.call('GET', '/readyz', { key: null });
      expect(ready.status, JSON.stringify(ready.body)).to.equal(200);
    } finally {
      if (other.inTransaction) other.exec('ROLLBACK');
      other.close();
      await h.close();
    }
  });

  it('answers /readyz 503 when the store is unreachable', async () => {
    const h = await startHarness();
    try {
      await h.rt.store.close();
      const ready = await h.call('GET', '/readyz', { key: null });
      expect(ready.status).to.equal(503);
      expect(ready.body.checks.store.ok).to.equal(false);
      expect(ready.body.checks.redis.ok).to.equal(true);
    } finally {
      await h.close();
    }
  });
});
