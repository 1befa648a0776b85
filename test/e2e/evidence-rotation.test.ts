// The ledger's key rotated: entries signed with the earlier key (SERVICE_EVIDENCE_PREVIOUS_KEYS) still
// verify, and a pack whose range holds them names that key in its signed statement, so that the pack
// checks offline against the new key alone. Without the earlier key, such a pack is refused (409).
import { execFileSync } from 'node:child_process';
import fs from 'node:fs/promises';
import path from 'node:path';
import { expect } from 'chai';
import { gatesVerify } from '../../cli/gates.js';
import { parseEnv } from '../../config/env.js';
import { ledgerOf, readPack, signerOf, verifyPack, type PackFiles } from '../../engine/evidence/index.js';
import { evidencePacksOf, sealGateRun } from '../../engine/gates/index.js';
import { newId, systemClock, type GateRunRecord } from '../../engine/platform/index.js';
import { finishedRun, KEYS, startHarness, type Harness } from '../support/harness.js';
import { passed } from '../support/projects.js';

type Body = Record<string, any>;

const OLD = signerOf(Buffer.alloc(32, 1));
const NEW_SEED = Buffer.alloc(32, 2);
const NEW = signerOf(NEW_SEED);
/** The base64 line of a PEM: how an operator copies a public key into SERVICE_EVIDENCE_PREVIOUS_KEYS. */
const pemLine = (pem: string) =>
  pem
    .split('\n')
    .filter((l) => l && !l.startsWith('-----'))
    .join('');

describe('evidence after the ledger key is rotated', function () {
  this.timeout(60_000);
  let h: Harness;
  let dir: string;
  before(async () => {
    h = await startHarness({ env: { SERVICE_EVIDENCE_KEY: NEW_SEED.toString('hex'), SERVICE_EVIDENCE_PREVIOUS_KEYS: pemLine(OLD.publicKeyPem) } });
    dir = path.join(h.tenantDir(), 'rotated');
    await fs.mkdir(dir, { recursive: true });
    await fs.writeFile(path.join(dir, 'gates.yaml'), 'gates:\n  - id: a\n    run: [/bin/true]\n  - id: b\n    run: [/bin/true]\n');
    execFileSync('sh', ['-c', 'git init -q && git add -A && git -c user.name=t -c user.email=t@t commit -qm init'], { cwd: dir });
  });
  after(async () => {
    await h.close();
  });

  it('packs entries sealed with the earlier key beside newer ones, names that key in the signed statement, and verifies offline', async () => {
    // a gate run sealed before the rotation, with the earlier key
    const git = (...args: string[]) => execFileSync('git', args, { cwd: dir, encoding: 'utf8' }).trim();
    const subject = { workspace: 'rotated', commit: git('rev-parse', 'HEAD'), tree: git('rev-parse', 'HEAD^{tree}'), dirty: false };
    const at = new Date(Date.now() - 60_000).toISOString();
    const before: GateRunRecord = {
      id: newId('grn'),
      tenant_id: 'tenant-a',
      workspace: 'rotated',
      status: 'running',
      source: 'gates.yaml',
      gates: ['a', 'b'],
      required_gates: ['a', 'b'],
      trigger: { type: 'api' },
      subject,
      results: [],
      ledger: null,
      created_at: at,
      finished_at: null,
    };
    await h.rt.store.gateRuns.insert(before);
    for (const id of ['a', 'b']) await h.rt.store.gateRuns.putResult('tenant-a', before.id, passed(id, subject, at));
    const oldLedger = ledgerOf({ store: h.rt.store, clock: systemClock, signer: OLD });
    expect((await sealGateRun({ store: h.rt.store, clock: systemClock, ledger: oldLedger }, before))!.status).to.equal('succeeded');
    // after it, gate b runs again in the service, sealed with the new key
    const started = await h.rt.engine.gates.start('tenant-a', { workspace: 'rotated', only: ['b'], trigger: { type: 'api' } });
    expect((await h.rt.engine.gates.wait('tenant-a', started.id)).status).to.equal('succeeded');

    const json = await h.call<Body>('GET', '/api/v1/autonomy/evidence-pack?workspace=rotated');
    expect(json.status, json.text).to.equal(200);
    expect(json.body.public_key.key_id).to.equal(NEW.keyId);
    const ledger = json.body.statement.predicate.ledger;
    expect(ledger.key_id).to.equal(NEW.keyId);
    expect(ledger.earlier_keys).to.deep.equal([{ key_id: OLD.keyId, pem: OLD.publicKeyPem }]);
    expect(json.body.statement.predicate.gates.map((g: Body) => [g.gate_id, g.gate_run_id ?? null])).to.have.length(2);

    const tar = await fetch(`${h.url}/api/v1/autonomy/evidence-pack?workspace=rotated&format=tar`, { headers: { authorization: `Bearer ${KEYS.a}` } });
    const files = await readPack(Buffer.from(await tar.arrayBuffer()));
    const signers = new Set(files.entries!.map((e) => e.key_id));
    expect([...signers].sort(), 'the slice holds entries of both keys').to.deep.equal([NEW.keyId, OLD.keyId].sort());
    expect(verifyPack(files, { keyId: NEW.keyId, tenantId: 'tenant-a' })).to.deep.include({ ok: true, earlier_keys: [OLD.keyId] });

    // the CLI's check says which earlier key signed some entries, and that the pinned key vouches for it
    const packFile = path.join(h.config.dataDir, 'rotated-pack.tar');
    await fs.writeFile(
      packFile,
      Buffer.from(
        await (
          await fetch(`${h.url}/api/v1/autonomy/evidence-pack?workspace=rotated&format=tar`, { headers: { authorization: `Bearer ${KEYS.a}` } })
        ).arrayBuffer(),
      ),
    );
    let printed = '';
    expect(await gatesVerify(packFile, { key: NEW.keyId }, (t) => (printed += t))).to.equal(0);
    expect(printed).to.contain(`signed by the ledger's earlier key ${OLD.keyId}, which key ${NEW.keyId} vouches for`);

    // what the signature vouches for is what counts: a statement that names no earlier key, or another key
    // under the earlier key's id, fails even when signed with the new key
    const signedAs = (edit: (l: Body) => void) => {
      const copy: PackFiles = structuredClone(files);
      edit(copy.pack.statement.predicate.ledger as Body);
      copy.pack.envelope = h.rt.engine.evidence.envelope(copy.pack.statement);
      const v = verifyPack(copy, { keyId: NEW.keyId });
      return v.ok ? null : v.problem;
    };
    expect(signedAs((l) => delete l.earlier_keys)).to.deep.include({
      part: 'signature',
      message: `entry ${files.entries![0]!.seq} is signed by key ${OLD.keyId}, not ${NEW.keyId}`,
    });
    expect(signedAs((l) => (l.earlier_keys[0].pem = signerOf(Buffer.alloc(32, 9)).publicKeyPem))).to.deep.include({ part: 'statement' });
    // an earlier key named but not the one that signed: the entry's own key is still unknown
    const stranger = signerOf(Buffer.alloc(32, 9));
    expect(signedAs((l) => (l.earlier_keys = [{ key_id: stranger.keyId, pem: stranger.publicKeyPem }]))).to.deep.include({ part: 'signature' });

    // the service without the earlier key refuses to sign a pack over entries it cannot verify
    const unvouched = ledgerOf({ store: h.rt.store, clock: systemClock, signer: NEW });
    const packs = evidencePacksOf({ store: h.rt.store, clock: systemClock, ledger: unvouched, gates: h.rt.engine.gates });
    const refused = await packs.build('tenant-a', { workspace: 'rotated' }).then(
      () => null,
      (err: Error & { status?: number }) => err,
    );
    expect(refused?.message).to.contain(`is signed by key ${OLD.keyId}, not ${NEW.keyId}`);
  });

  it("ends a gate run canceled, with its gates' results and why, when the ledger refuses the service's key: no retry seals it and its step fails", async () => {
    // tenant-b's ledger was written with a key this service neither has nor names (another deployment's, a typo)
    const stranger = signerOf(Buffer.alloc(32, 7));
    const bDir = path.join(h.tenantDir('tenant-b'), 'refused');
    await fs.mkdir(bDir, { recursive: true });
    await fs.writeFile(path.join(bDir, 'gates.yaml'), 'gates:\n  - id: a\n    run: [/bin/true]\n');
    execFileSync('sh', ['-c', 'git init -q && git add -A && git -c user.name=t -c user.email=t@t commit -qm init'], { cwd: bDir });
    await ledgerOf({ store: h.rt.store, clock: systemClock, signer: stranger }).append('tenant-b', [
      { kind: 'note', subject: { workspace: 'refused' }, payload: {} },
    ]);

    const started = await h.rt.engine.gates.start('tenant-b', { workspace: 'refused', trigger: { type: 'api' } });
    const end = await h.rt.engine.gates.wait('tenant-b', started.id);
    expect(end).to.deep.include({ status: 'canceled', ledger: null });
    expect(end.results.map((r) => [r.gate_id, r.conclusion])).to.deep.equal([['a', 'success']]);
    expect(end.error).to.contain('not sealed').and.contain(`signed by key ${stranger.keyId}`).and.contain('SERVICE_EVIDENCE_PREVIOUS_KEYS');
    expect((await h.rt.store.evidence.head('tenant-b'))!.key_id, "nothing chained after the stranger's entry").to.equal(stranger.keyId);
    // nothing is left for the reconciler to seal again and again
    expect(await h.rt.engine.gates.reconcile(0, { elsewhere: async () => new Set() })).to.equal(0);
    expect(h.logs.some((l) => l.includes('the evidence ledger refused the service'))).to.equal(true);

    // a run's gates step says so, and fails
    const posted = await h.call<Body>('POST', '/api/v1/autonomy/run', { key: KEYS.b, body: { workspace: 'refused', steps: [{ tool: 'gates', args: {} }] } });
    expect(posted.status, posted.text).to.equal(202);
    const run = await finishedRun(h, posted.body.run_id, KEYS.b);
    expect(run.status).to.equal('failed');
    expect(run.error.code).to.equal('gates-not-sealed');
    expect(run.steps[0].output).to.deep.include({ status: 'canceled', ledger: null });
    expect(run.steps[0].output.results).to.deep.equal([
      { gate_id: 'a', required: true, conclusion: 'success', summary: run.steps[0].output.results[0].summary },
    ]);
  });

  it('takes earlier keys as raw bytes in hex or base64, or as a PEM line, and refuses anything else at start', () => {
    const raw = Buffer.from(pemLine(OLD.publicKeyPem), 'base64').subarray(-32);
    const base = { SERVICE_EVIDENCE_KEY: NEW_SEED.toString('hex') };
    for (const value of [raw.toString('hex'), raw.toString('base64'), pemLine(OLD.publicKeyPem), `${raw.toString('hex')}, ${pemLine(NEW.publicKeyPem)}`])
      expect(parseEnv({ ...base, SERVICE_EVIDENCE_PREVIOUS_KEYS: value }).evidencePreviousKeys.length, value).to.be.greaterThan(0);
    for (const value of ['short', 'zz'.repeat(32), Buffer.alloc(40).toString('base64')])
      expect(() => parseEnv({ ...base, SERVICE_EVIDENCE_PREVIOUS_KEYS: value }), value).to.throw(/SERVICE_EVIDENCE_PREVIOUS_KEYS/);
  });
});
