// The evidence pack's cost: the JSON answer reads no artifact, and the tar is streamed, its artifacts read
// one at a time as the client takes them and no more once it has gone away.
import { randomBytes } from 'node:crypto';
import fs from 'node:fs/promises';
import path from 'node:path';
import { expect } from 'chai';
import { gatesVerify } from '../../cli/gates.js';
import { readPack, verifyPack, type PackFiles, type PackJson } from '../../engine/evidence/index.js';
import { eventually, KEYS, startHarness, type Harness } from '../support/harness.js';

type Body = Record<string, any>;

/** 4 gates, each keeping 5 artifacts of 1 MB (the most a gate keeps): a tar of about 27 MB. */
const GATES = 4;
const ARTIFACTS = 5;
const ARTIFACT_BYTES = 1_000_000;

describe('evidence packs of large artifacts', function () {
  this.timeout(120_000);
  let h: Harness;
  /** the payload digests of every artifact the packed gate run kept */
  let artifacts: Set<string>;
  /** each call's digests to the store's payload read that names an artifact, while `watchReads` is on */
  let reads: string[][];
  let unwatch: (() => void) | undefined;

  const watchReads = () => {
    reads = [];
    const repo = h.rt.store.evidence;
    const payloads = repo.payloads;
    repo.payloads = async (tenantId, digests) => {
      if (digests.some((d) => artifacts.has(d))) reads.push([...digests]);
      return payloads.call(repo, tenantId, digests);
    };
    unwatch = () => {
      repo.payloads = payloads;
      unwatch = undefined;
    };
  };
  const artifactsRead = () => reads.flat().filter((d) => artifacts.has(d)).length;
  const tar = (opts: { signal?: AbortSignal; requestId?: string } = {}) =>
    fetch(`${h.url}/api/v1/autonomy/evidence-pack?workspace=packed&format=tar`, {
      headers: { authorization: `Bearer ${KEYS.a}`, ...(opts.requestId ? { 'x-request-id': opts.requestId } : {}) },
      signal: opts.signal,
    });

  before(async () => {
    h = await startHarness();
    const dir = path.join(h.tenantDir(), 'packed');
    const yaml = ['gates:'];
    for (let g = 0; g < GATES; g++) {
      yaml.push(`  - id: g${g}`, '    run: [/bin/true]', `    artifacts: ['out/g${g}/*']`);
      await fs.mkdir(path.join(dir, 'out', `g${g}`), { recursive: true });
      for (let a = 0; a < ARTIFACTS; a++) await fs.writeFile(path.join(dir, 'out', `g${g}`, `a${a}.bin`), randomBytes(ARTIFACT_BYTES));
    }
    await fs.writeFile(path.join(dir, 'gates.yaml'), yaml.join('\n') + '\n');
    const started = await h.rt.engine.gates.start('tenant-a', { workspace: 'packed', trigger: { type: 'api' } });
    const sealed = await h.rt.engine.gates.wait('tenant-a', started.id);
    expect(sealed.status).to.equal('succeeded');
    artifacts = new Set(sealed.results.flatMap((r) => r.artifacts.map((a) => a.payload_digest)));
    expect(artifacts.size).to.equal(GATES * ARTIFACTS);
  });
  afterEach(() => unwatch?.());
  after(async () => {
    await h.close();
  });

  it('answers the JSON pack without reading any artifact', async () => {
    watchReads();
    const json = await h.call<Body>('GET', '/api/v1/autonomy/evidence-pack?workspace=packed');
    expect(json.status, json.text.slice(0, 500)).to.equal(200);
    expect(json.body.statement.predicate.gates).to.have.length(GATES);
    expect(verifyPack({ pack: json.body as PackJson, publicKeyPem: json.body.public_key.pem, entries: null, payloads: null })).to.deep.include({ ok: true });
    expect(artifactsRead(), 'artifacts read for a JSON answer').to.equal(0);
    // read as a file: also as an editor or a pipe leaves it, with a byte-order mark or white space before it
    for (const saved of [json.text, `\uFEFF${json.text}`, `\n  ${JSON.stringify(json.body, null, 2)}\n`])
      expect(verifyPack(await readPack(Buffer.from(saved, 'utf8'))), JSON.stringify(saved.slice(0, 3))).to.deep.include({ ok: true });
  });

  it('checks 2 of a tenant’s packs at once: a third is refused at once (429, Retry-After), and the tar’s streaming holds no place', async () => {
    // the ledger's payloads are read while a pack is checked: held here, the first two packs stay in their check
    const repo = h.rt.store.evidence;
    const payloads = repo.payloads;
    let open!: () => void;
    const opened = new Promise<void>((r) => (open = r));
    let waiting = 0;
    repo.payloads = async (tenantId, digests) => {
      waiting++;
      await opened;
      return payloads.call(repo, tenantId, digests);
    };
    try {
      const pack = () => h.call<Body>('GET', '/api/v1/autonomy/evidence-pack?workspace=packed');
      const held = [pack(), pack()];
      await eventually(() => waiting === 2, 'both packs in their check');
      const third = await pack();
      expect(third.status, third.text).to.equal(429);
      expect(third.body.code).to.equal('rate-limited');
      expect(third.headers.get('retry-after')).to.equal('2');
      open();
      for (const done of await Promise.all(held)) expect(done.status, done.text.slice(0, 300)).to.equal(200);
    } finally {
      repo.payloads = payloads;
    }
    // the places are given back; two tars being streamed (their clients take nothing yet) hold none
    const streaming = [await tar(), await tar()];
    expect(streaming.map((r) => r.status)).to.deep.equal([200, 200]);
    const json = await h.call<Body>('GET', '/api/v1/autonomy/evidence-pack?workspace=packed');
    expect(json.status, json.text.slice(0, 300)).to.equal(200);
    await Promise.all(streaming.map((r) => r.body!.cancel()));
  });

  it('streams a tar of several MB, reading its artifacts one at a time as the client takes them; it verifies offline', async () => {
    const keyId = (await h.call<Body>('GET', '/api/v1/autonomy/evidence-pack?workspace=packed')).body.public_key.key_id as string;
    watchReads();
    const res = await tar();
    expect(res.status).to.equal(200);
    expect(res.headers.get('content-type')).to.contain('application/x-tar');
    // the answer has begun and the client reads nothing for a while: the server waits for it, it does not read ahead
    await new Promise((r) => setTimeout(r, 500));
    const before = artifactsRead();
    expect(before, 'artifacts read before the client took any of the tar').to.be.below(artifacts.size);
    const bytes = Buffer.from(await res.arrayBuffer());
    expect(bytes.length).to.be.above(GATES * ARTIFACTS * ARTIFACT_BYTES);
    expect(
      reads.every((call) => call.length === 1),
      'one artifact a read',
    ).to.equal(true);
    expect(artifactsRead(), 'each artifact read once').to.equal(artifacts.size);
    const files = await readPack(bytes);
    expect(verifyPack(files, { keyId, tenantId: 'tenant-a' })).to.deep.include({ ok: true });
    for (const digest of artifacts) expect(files.payloads!.has(digest), digest).to.equal(true);
  });

  it('stops reading artifacts when the client goes away in the middle of the tar', async () => {
    watchReads();
    const abort = new AbortController();
    const requestId = `gone-${randomBytes(4).toString('hex')}`;
    const res = await tar({ signal: abort.signal, requestId });
    expect(res.status).to.equal(200);
    const reader = res.body!.getReader();
    let received = 0;
    while (received < 3 * ARTIFACT_BYTES) received += (await reader.read()).value?.length ?? 0;
    abort.abort();
    await reader.cancel().catch(() => undefined);
    // the reads stop: none for half a second
    let seen = -1;
    await eventually(async () => {
      const now = artifactsRead();
      if (now === seen) return true;
      seen = now;
      await new Promise((r) => setTimeout(r, 500));
      return false;
    }, 'the artifact reads to stop');
    expect(seen, 'artifacts read in all').to.be.below(artifacts.size);
    // the server saw the client go, and says so as no failure of its own
    await eventually(() => h.logs.some((l) => l.includes(requestId) && l.includes('the client went away')), 'the server to see the client gone');
    // and goes on answering
    expect((await h.call('GET', '/api/v1/autonomy/evidence-pack?workspace=packed')).status).to.equal(200);
  });

  it('cuts the connection of a tar whose artifact cannot be read midway, so that it never looks whole, and logs the failure', async () => {
    const repo = h.rt.store.evidence;
    const payloads = repo.payloads;
    let artifactReads = 0;
    repo.payloads = async (tenantId, digests) => {
      if (digests.some((d) => artifacts.has(d)) && ++artifactReads === 3) throw new Error('the store failed');
      return payloads.call(repo, tenantId, digests);
    };
    unwatch = () => {
      repo.payloads = payloads;
      unwatch = undefined;
    };
    const requestId = `cut-${randomBytes(4).toString('hex')}`;
    const res = await tar({ requestId });
    expect(res.status).to.equal(200);
    const read = await res.arrayBuffer().then(
      () => 'whole',
      (err: Error) => `cut: ${err.message}`,
    );
    expect(read).to.match(/^cut/);
    await eventually(() => h.logs.some((l) => l.includes(requestId) && l.includes('failed midway') && l.includes('the store failed')), 'the failure logged');
  });

  it('cuts the connection of a tar whose artifact the store does not keep, rather than leave it out of a tar that looks whole', async () => {
    const repo = h.rt.store.evidence;
    const payloads = repo.payloads;
    let artifactReads = 0;
    let dropped = '';
    repo.payloads = async (tenantId, digests) => {
      if (digests.some((d) => artifacts.has(d)) && ++artifactReads === 3) {
        dropped = digests[0]!;
        return [];
      }
      return payloads.call(repo, tenantId, digests);
    };
    unwatch = () => {
      repo.payloads = payloads;
      unwatch = undefined;
    };
    const requestId = `lost-${randomBytes(4).toString('hex')}`;
    const res = await tar({ requestId });
    expect(res.status).to.equal(200);
    const read = await res.arrayBuffer().then(
      () => 'whole',
      (err: Error) => `cut: ${err.message}`,
    );
    expect(read, 'the tar without an artifact').to.match(/^cut/);
    await eventually(() => h.logs.some((l) => l.includes(requestId) && l.includes('failed midway') && l.includes(dropped)), 'the failure logged');
  });

  it('refuses a tar stripped of artifacts its sealed results name (naming each), or cut short anywhere; the CLI says FAILED of one cut mid-file', async () => {
    const keyId = (await h.call<Body>('GET', '/api/v1/autonomy/evidence-pack?workspace=packed')).body.public_key.key_id as string;
    const bytes = Buffer.from(await (await tar()).arrayBuffer());
    const files = await readPack(bytes);
    expect(verifyPack(files, { keyId })).to.deep.include({ ok: true });
    // two artifacts taken out of the files: every payload left matches its digest, the ledger is whole
    const [first, second] = [...artifacts];
    const stripped: PackFiles = { ...files, payloads: new Map(files.payloads) };
    stripped.payloads!.delete(first!);
    stripped.payloads!.delete(second!);
    const verdict = verifyPack(stripped, { keyId });
    expect(verdict.ok, 'a pack without two of its artifacts').to.equal(false);
    if (!verdict.ok) {
      expect(verdict.problem.part).to.equal('payload');
      expect(verdict.problem.message).to.contain(first!).and.contain(second!);
    }
    // the tar cut at the start of its last file: whole files only, but no end-of-archive marker
    const headerAt = Math.max(...[...artifacts].map((d) => bytes.indexOf(`payloads/${d.replace(/^sha256:/, '')}.json`)));
    expect(headerAt % 512, 'a header starts a block').to.equal(0);
    const atBorder = bytes.subarray(0, headerAt);
    expect(
      await readPack(atBorder).then(
        () => 'read',
        (err: Error) => err.message,
      ),
    ).to.contain('no end-of-archive marker');
    // without its end-of-archive blocks only, every file there: refused as well (nothing says it was not cut)
    expect(bytes.subarray(-1024).every((b) => b === 0)).to.equal(true);
    expect(
      await readPack(bytes.subarray(0, bytes.length - 1024)).then(
        () => 'read',
        (err: Error) => err.message,
      ),
    ).to.contain('no end-of-archive marker');
    // cut in the middle of a file: an error to catch, not one thrown out of the reader
    const midFile = bytes.subarray(0, headerAt + 512 + 1000);
    expect(
      await readPack(midFile).then(
        () => 'read',
        (err: Error) => err.message,
      ),
    ).to.match(/Unexpected end of data/);
    const file = path.join(h.config.dataDir, 'cut.tar');
    for (const cut of [midFile, atBorder]) {
      await fs.writeFile(file, cut);
      const out: string[] = [];
      expect(await gatesVerify(file, { key: keyId }, (t) => out.push(t))).to.equal(1);
      expect(out.join('')).to.match(/^FAILED \(envelope\): not an evidence pack: /);
    }
  });

  it('answers HEAD of a tar with its headers, reading no artifact', async () => {
    watchReads();
    const res = await fetch(`${h.url}/api/v1/autonomy/evidence-pack?workspace=packed&format=tar`, {
      method: 'HEAD',
      headers: { authorization: `Bearer ${KEYS.a}` },
    });
    expect(res.status).to.equal(200);
    expect(res.headers.get('content-type')).to.contain('application/x-tar');
    expect(artifactsRead()).to.equal(0);
  });

  it('packs the gate runs of a folder gone since they were sealed (a run’s checkout), by the name they keep; only for their tenant', async () => {
    const dir = path.join(h.tenantDir(), 'checked-out');
    await fs.mkdir(dir);
    await fs.writeFile(path.join(dir, 'gates.yaml'), 'gates:\n  - id: unit\n    run: [/bin/true]\n');
    const started = await h.rt.engine.gates.start('tenant-a', { workspace: 'checked-out', trigger: { type: 'api' } });
    expect((await h.rt.engine.gates.wait('tenant-a', started.id)).status).to.equal('succeeded');
    await fs.rm(dir, { recursive: true });
    for (const name of ['checked-out', './checked-out/']) {
      const json = await h.call<Body>('GET', `/api/v1/autonomy/evidence-pack?workspace=${encodeURIComponent(name)}`);
      expect(json.status, json.text.slice(0, 500)).to.equal(200);
      expect(json.body.statement.predicate).to.deep.include({ workspace: 'checked-out' });
      expect(json.body.statement.predicate.gates.map((g: Body) => [g.gate_id, g.conclusion])).to.deep.equal([['unit', 'success']]);
      expect(verifyPack({ pack: json.body as PackJson, publicKeyPem: json.body.public_key.pem, entries: null, payloads: null })).to.deep.include({ ok: true });
    }
    // a name no gate run of the tenant keeps is still a folder that is not there; another tenant's, too
    for (const [name, key] of [
      ['never-there', KEYS.a],
      ['checked-out', KEYS.b],
      ['../tenant-a/checked-out', KEYS.b],
    ] as const) {
      const refused = await h.call<Body>('GET', `/api/v1/autonomy/evidence-pack?workspace=${encodeURIComponent(name)}`, { key });
      expect(refused.status, `${name}: ${refused.text}`).to.equal(400);
    }
  });
});
