// Gates through the service: a signed GitHub push fires the gates-on-push automation, whose `gates`
// step runs the workspace's gate set as a BullMQ flow (one job per gate, sealed into the ledger).
import fs from 'node:fs/promises';
import path from 'node:path';
import { expect } from 'chai';
import { publicKeyFromPem, verifyEntries, GENESIS_HASH } from '../../engine/evidence/index.js';
import { eventually, finishedRun, startHarness, type Harness } from '../support/harness.js';
import * as sign from '../support/signers.js';
import { GATES_YAML, makeProject } from '../support/projects.js';

type Body = Record<string, any>;

describe('gates in the service', function () {
  this.timeout(90_000);
  let h: Harness;
  before(async () => {
    h = await startHarness();
  });
  after(async () => {
    await h.close();
  });

  it('runs the gates of the workspace from a signed push, one job per gate, and seals the results into the ledger', async () => {
    // a gate that tries to read the service's own secret keys from its data dir: the sandbox has no such files
    const peek = GATES_YAML.replace('"$DATA_DIR_GUESS/secret.key"', `"${h.config.dataDir}/secret.key" "${h.config.dataDir}/evidence.key"`);
    await makeProject(h.tenantDir(), peek);
    const automation = await h.call<Body>('POST', '/api/v1/automations/templates/instantiate', {
      body: { template_id: 'gates-on-push', variables: { repository: 'acme/app', branch: 'main' } },
    });
    expect(automation.status, automation.text).to.equal(201);
    expect((await h.call('PUT', '/api/v1/webhook-secrets/codehost', { body: { secrets: ['push-secret-0123456789'] } })).status).to.equal(200);
    const push = await sign.codehost('push-secret-0123456789', { ref: 'refs/heads/main', repository: { full_name: 'acme/app' }, after: 'abc' });
    const res = await fetch(`${h.url}/webhooks/tenant-a/codehost`, { method: 'POST', headers: push.headers, body: push.body });
    expect(res.status).to.equal(200);

    const runId = await eventually(async () => (await h.call<Body>('GET', `/api/v1/automations/${automation.body.id}/history`)).body.data[0]?.id, 'the run');
    const run = await finishedRun(h, runId);
    // the test gate fails (one of its two tests is wrong): a required gate, so the step and the run fail
    expect(run.status).to.equal('failed');
    expect(run.error.code).to.equal('gates-failed');
    expect(run.error.message).to.contain('test');
    const step = run.steps[0];
    expect(step.tool).to.equal('gates');
    const byGate = Object.fromEntries(step.output.results.map((r: Body) => [r.gate_id, r.conclusion]));
    expect(byGate).to.deep.equal({ typecheck: 'success', test: 'failure', slow: 'timed_out', peek: 'success', secrets: 'success' });
    expect(step.output.ref).to.equal('refs/heads/main');

    const gateRun = await h.rt.engine.gates.get('tenant-a', step.output.gate_run_id);
    expect(gateRun).to.deep.include({ status: 'failed', workspace: '.', source: 'gates.yaml' });
    expect(gateRun.trigger).to.deep.equal({ type: 'run', run_id: runId, session_id: run.session_id });
    expect(gateRun.subject!.commit).to.match(/^[0-9a-f]{40}$/);
    const peekResult = gateRun.results.find((r) => r.gate_id === 'peek')!;
    expect(peekResult.output_tail).to.contain('No such file or directory').and.contain('key=[]');
    const secretKey = (await fs.readFile(path.join(h.config.dataDir, 'secret.key'), 'utf8')).trim();
    expect(JSON.stringify(gateRun)).not.to.contain(secretKey);
    // a job per gate and the seal, named by the gate run
    const queue = h.rt.queues.get('gates');
    for (const id of ['typecheck', 'test', 'slow', 'peek', 'secrets', 'seal'])
      expect(await (await queue.getJob(`${gateRun.id}__${id}`))?.getState(), id).to.equal('completed');

    // sealed: one entry per gate and one for the run, chained and signed
    const entries = await h.rt.engine.evidence.list('tenant-a', { limit: 100 });
    expect(entries.map((e) => e.kind)).to.deep.equal(['gate.result', 'gate.result', 'gate.result', 'gate.result', 'gate.result', 'gate.run']);
    expect(gateRun.ledger).to.deep.equal({ from_seq: 1, to_seq: 6, head_hash: entries[5]!.hash });
    const payloads = new Map(
      (
        await h.rt.engine.evidence.payloads(
          'tenant-a',
          entries.map((e) => e.payload_digest),
        )
      ).map((p) => [p.digest, p.body]),
    );
    const key = h.rt.engine.evidence.publicKey;
    expect(verifyEntries(entries, { publicKey: publicKeyFromPem(key.pem)!, keyId: key.key_id, prevHash: GENESIS_HASH, payloads })).to.equal(null);
    expect(JSON.parse(payloads.get(entries[1]!.payload_digest)!)).to.deep.include({ gate_id: 'test', conclusion: 'failure' });

    // the run's session stream told each gate's end, then the seal
    const events = await h.rt.events.after(`session:${run.session_id}`, '0-0');
    expect(
      events
        .filter((e) => e.type === 'gate.finished')
        .map((e) => (e.data as Body).gate_id)
        .sort(),
    ).to.deep.equal(['peek', 'secrets', 'slow', 'test', 'typecheck']);
    expect(events.find((e) => e.type === 'gate.run_finished')!.data).to.deep.include({ status: 'failed', failed_required: ['test'] });
  });
});
