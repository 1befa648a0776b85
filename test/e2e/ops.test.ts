import { expect } from 'chai';
import { eventually, KEYS, startHarness } from '../support/harness.js';

describe('operations', function () {
  this.timeout(30_000);

  it('serves Prometheus metrics to admins only: HTTP latency, runs by kind and status, run durations, queue depths', async () => {
    const h = await startHarness();
    try {
      const { body } = await h.call('POST', '/api/v1/autonomy/run', { body: { steps: [{ tool: 'shell', args: { command: 'true' } }] } });
      await eventually(async () => (await h.call('GET', `/api/v1/runs/${body.run_id}`)).body.status === 'succeeded', 'the run');
      expect((await h.call('GET', '/metrics', { key: null })).status).to.equal(401);
      expect((await h.call('GET', '/metrics', { key: KEYS.a })).status).to.equal(401);
      // an error answer keeps its route's whole name, not the sub-router's part of it
      expect((await h.call('GET', '/api/v1/runs/run_00000000000000000000000000')).status).to.equal(404);
      expect((await h.call('GET', '/api/v1/sessions/ses_00000000000000000000000000/tasks')).status).to.equal(404);
      const res = await h.call('GET', '/metrics', { key: KEYS.admin });
      expect(res.status).to.equal(200);
      expect(res.headers.get('content-type')).to.contain('text/plain');
      expect(res.text).to.match(/automation_http_request_duration_seconds_bucket\{.*route="\/api\/v1\/autonomy\/run".*status="202"/);
      expect(res.text).to.match(/automation_http_request_duration_seconds_count\{method="GET",route="\/api\/v1\/runs\/:id",status="404"\} 1/);
      expect(res.text).to.match(/automation_http_request_duration_seconds_count\{method="GET",route="\/api\/v1\/sessions\/:id\/tasks",status="404"\} 1/);
      expect(res.text).not.to.match(/route="\/:id/);
      expect(res.text).to.match(/^automation_runs\{kind="autonomy",status="succeeded"\} 1$/m);
      expect(res.text).to.match(/^automation_run_duration_seconds_count\{kind="autonomy",status="succeeded"\} 1$/m);
      expect(res.text).to.match(/^automation_queue_jobs\{queue="runs",state="waiting"\} 0$/m);
      // a store that does not answer costs the scrape the runs gauge, not the scrape (it was a 500 with no metrics)
      const count = h.rt.store.runs.countByKindAndStatus;
      h.rt.store.runs.countByKindAndStatus = () => Promise.reject(new Error('the store is closed'));
      try {
        const without = await h.call('GET', '/metrics', { key: KEYS.admin });
        expect(without.status).to.equal(200);
        expect(without.text).not.to.match(/^automation_runs\{/m);
        expect(without.text).to.match(/^automation_queue_jobs\{queue="runs",state="waiting"\} 0$/m);
      } finally {
        h.rt.store.runs.countByKindAndStatus = count;
      }
    } finally {
      await h.close();
    }
  });

  it('ends open event streams at shutdown so clients can resume elsewhere', async () => {
    const h = await startHarness();
    let closed = false;
    try {
      const { body } = await h.call('POST', '/api/v1/autonomy/run', {
        body: { steps: [{ tool: 'shell', args: { command: 'sleep 20' } }], budget_seconds: 30 },
      });
      const res = await fetch(`${h.url}/api/v1/autonomy/streaming/${body.session_id}/events`, { headers: { authorization: `Bearer ${KEYS.a}` } });
      const reader = res.body!.getReader();
      let text = '';
      while (!text.includes('event: step.started')) text += new TextDecoder().decode((await reader.read()).value);
      const started = Date.now();
      await h.web.close();
      for (;;) {
        const { value, done } = await reader.read();
        if (done) break;
        text += new TextDecoder().decode(value);
      }
      expect(Date.now() - started).to.be.below(3000);
      expect(text).to.contain('event: run.started');
      await h.call('POST', `/api/v1/runs/${body.run_id}/cancel`).catch(() => undefined);
      await h.rt.engine.runs.cancel('tenant-a', body.run_id).catch(() => undefined);
      await h.close();
      closed = true;
    } finally {
      if (!closed) await h.close();
    }
  });
});
