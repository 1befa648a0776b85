import { expect } from 'chai';
import { startHarness } from '../support/harness.js';

describe('health', () => {
  it('answers /healthz and /readyz without a key while Redis and the store answer', async () => {
    const h = await startHarness();
    try {
      const live = await h.call('GET', '/healthz', { key: null });
      expect(live.status).to.equal(200);
      expect(live.body).to.deep.equal({ status: 'ok' });
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
