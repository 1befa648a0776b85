// The signed ledger on the real store: entries chain and verify; a change to any byte of an entry, a
// signature, a link or a payload is caught, and the first bad entry is named.
import { randomBytes } from 'node:crypto';
import fs from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import { expect } from 'chai';
import { entryHash, GENESIS_HASH, ledgerOf, publicKeyFromPem, signerOf, verifyEntries, verifyEntriesAsync } from '../../engine/evidence/index.js';
import { ConflictError, systemClock, type LedgerEntry } from '../../engine/platform/index.js';
import { openStore, type Store } from '../../engine/store/index.js';

describe('evidence ledger', () => {
  let dir: string;
  let store: Store;
  before(async () => {
    dir = await fs.mkdtemp(path.join(os.tmpdir(), 'ledger-'));
    store = await openStore({ dataDir: dir, mongodbUri: undefined });
  });
  after(async () => {
    await store.close();
    await fs.rm(dir, { recursive: true, force: true });
  });

  it('chains and signs entries that verify with the public key alone; any change is caught at its entry', async () => {
    const signer = signerOf(randomBytes(32));
    const ledger = ledgerOf({ store, clock: systemClock, signer });
    await ledger.append('acme', [
      { kind: 'gate.result', subject: { workspace: '.', commit: 'a'.repeat(40) }, payload: { gate: 'test', conclusion: 'success' } },
    ]);
    await ledger.append('acme', [
      { kind: 'gate.result', subject: { workspace: '.' }, payload: { gate: 'lint', conclusion: 'failure', annotations: [{ line: 3 }] } },
      { kind: 'gate.run', subject: { workspace: '.' }, payload: { gates: ['test', 'lint'] } },
    ]);
    await ledger.append('other', [{ kind: 'gate.result', subject: {}, payload: { gate: 'x' } }]);
    const entries = await ledger.list('acme', { limit: 10 });
    expect(entries.map((e) => e.seq)).to.deep.equal([1, 2, 3]);
    expect(entries[0]!.prev_hash).to.equal(GENESIS_HASH);
    const payloads = new Map(
      (
        await ledger.payloads(
          'acme',
          entries.map((e) => e.payload_digest),
        )
      ).map((p) => [p.digest, p.body]),
    );
    const publicKey = publicKeyFromPem(ledger.publicKey.pem)!;
    // the service's check (signatures on the thread pool, a chunk at a time) finds what the CLI's finds
    const check = async (list: LedgerEntry[], bodies = payloads) => {
      const opts = { publicKey, keyId: signer.keyId, prevHash: GENESIS_HASH, payloads: bodies };
      const found = verifyEntries(list, opts);
      expect(await verifyEntriesAsync(list, opts)).to.deep.equal(found);
      return found;
    };
    expect(await check(entries)).to.equal(null);
    expect((await ledger.list('other', { limit: 10 }))[0]!.seq).to.equal(1);

    const tampered = async (seq: number, change: (e: LedgerEntry) => void) => {
      const copy = structuredClone(entries);
      change(copy[seq - 1]!);
      return check(copy);
    };
    expect(await tampered(2, (e) => (e.kind = 'gate.resulT'))).to.deep.include({ part: 'entry', seq: 2 });
    expect(await tampered(1, (e) => (e.subject.commit = 'b'.repeat(40)))).to.deep.include({ part: 'entry', seq: 1 });
    expect(await tampered(3, (e) => (e.at = e.at.replace(/.$/, '1')))).to.deep.include({ part: 'entry', seq: 3 });
    expect(await tampered(2, (e) => (e.sig = `${e.sig[0] === 'A' ? 'B' : 'A'}${e.sig.slice(1)}`))).to.deep.include({ part: 'signature', seq: 2 });
    expect(await tampered(3, (e) => (e.prev_hash = `${e.prev_hash[0] === '0' ? '1' : '0'}${e.prev_hash.slice(1)}`))).to.deep.include({ part: 'chain', seq: 3 });
    // an entry re-hashed after its change still fails: its signature no longer matches, and the next link breaks
    expect(await tampered(2, (e) => (e.hash = `${e.hash[0] === 'f' ? 'e' : 'f'}${e.hash.slice(1)}`))).to.deep.include({ seq: 2 });
    // a dropped entry breaks the chain at the next one
    expect(await check([entries[0]!, entries[2]!])).to.deep.include({ part: 'chain', seq: 3 });
    // a payload changed by one byte
    const bodies = new Map(payloads);
    const digest = entries[1]!.payload_digest;
    bodies.set(digest, bodies.get(digest)!.replace('failure', 'success'));
    expect(await check(entries, bodies)).to.deep.include({ part: 'payload', seq: 2 });
    // another key
    const stranger = publicKeyFromPem(signerOf(randomBytes(32)).publicKeyPem)!;
    expect(verifyEntries(entries, { publicKey: stranger, keyId: signer.keyId })).to.deep.include({ part: 'signature', seq: 1 });
  });

  it('checks a long slice off the event loop and names the same first problem across its chunks', async () => {
    const signer = signerOf(randomBytes(32));
    const ledger = ledgerOf({ store, clock: systemClock, signer });
    const entries = await ledger.append(
      'long',
      Array.from({ length: 600 }, (_, i) => ({ kind: 'gate.result', subject: { workspace: '.' }, payload: { i } })),
    );
    const opts = { publicKey: publicKeyFromPem(ledger.publicKey.pem)!, keyId: signer.keyId, prevHash: GENESIS_HASH };
    const flip = (sig: string) => `${sig[0] === 'A' ? 'B' : 'A'}${sig.slice(1)}`;
    const both = async (list: LedgerEntry[]) => {
      const found = verifyEntries(list, opts);
      expect(await verifyEntriesAsync(list, opts)).to.deep.equal(found);
      return found;
    };
    // the event loop turns while it checks: a timer set before it fires before it ends
    let ticked = false;
    setTimeout(() => (ticked = true), 0);
    expect(await verifyEntriesAsync(entries, opts)).to.equal(null);
    expect(ticked).to.equal(true);
    // a bad signature in the second chunk, before a broken link in the third: the signature is named
    const a = structuredClone(entries);
    a[300]!.sig = flip(a[300]!.sig);
    a[550]!.prev_hash = GENESIS_HASH;
    expect(await both(a)).to.deep.include({ part: 'signature', seq: 301 });
    // a broken link in a chunk, before a bad signature later in the same chunk: the link is named
    const b = structuredClone(entries);
    b[260]!.prev_hash = GENESIS_HASH;
    b[270]!.sig = flip(b[270]!.sig);
    expect(await both(b)).to.deep.include({ part: 'chain', seq: 261 });
    // a bad signature just before a broken link, in the same chunk: the signature is named
    const c = structuredClone(entries);
    c[512]!.sig = flip(c[512]!.sig);
    c[513]!.kind = 'gate.run';
    expect(await both(c)).to.deep.include({ part: 'signature', seq: 513 });
  });

  it('refuses an entry of a key rotated out once another key signed after it, and an entry of another tenant', async () => {
    // ledgers signed by key A, rotated to B, then to C (the service's key; A and B its earlier keys)
    const seeds = [randomBytes(32), randomBytes(32), randomBytes(32)];
    const [a, b, c] = [signerOf(seeds[0]!), signerOf(seeds[1]!), signerOf(seeds[2]!)];
    const keyOf = (s: typeof a) => publicKeyFromPem(s.publicKeyPem)!;
    // written as whoever holds a seed and the store writes: the append takes any order of these keys (each knows the others)
    const writers = new Map(seeds.map((seed, i) => [[a, b, c][i]!.keyId, signerOf(seed, [a, b, c].map(keyOf))] as const));
    const signedBy = async (tenant: string, signers: (typeof a)[]) => {
      for (const [i, signer] of signers.entries())
        await ledgerOf({ store, clock: systemClock, signer: writers.get(signer.keyId)! }).append(tenant, [
          { kind: 'gate.result', subject: { workspace: '.' }, payload: { i } },
        ]);
      return store.evidence.list(tenant, { limit: 20 });
    };
    const earlier = new Map([
      [a.keyId, keyOf(a)],
      [b.keyId, keyOf(b)],
    ]);
    const check = async (list: LedgerEntry[]) => {
      const opts = { publicKey: keyOf(c), keyId: c.keyId, earlier, prevHash: GENESIS_HASH, tenantId: list[0]!.tenant_id };
      const found = verifyEntries(list, opts);
      expect(await verifyEntriesAsync(list, opts)).to.deep.equal(found);
      return found;
    };
    const run = `rotated-${Date.now()}`;
    const rotated = await signedBy(`${run}-abc`, [a, a, b, b, c, c]);
    expect(await check(rotated)).to.equal(null);
    // whoever holds a leaked earlier seed and the store's write access appends in its name: refused, whichever seed
    expect(await check(await signedBy(`${run}-a`, [a, a, b, b, c, c, a])), 'A after C').to.deep.include({ part: 'signature', seq: 7 });
    expect(await check(await signedBy(`${run}-b`, [a, a, b, b, c, c, b])), 'B after C').to.deep.include({ part: 'signature', seq: 7 });
    // before the current key has signed: a key that signs again after the key that took over from it
    expect(await check(await signedBy(`${run}-aba`, [a, b, a])), 'A after B').to.deep.include({ part: 'signature', seq: 3 });
    expect(await check(await signedBy(`${run}-ab`, [a, b])), 'A, then B: a rotation').to.equal(null);
    // the same entries checked as another tenant's slice (moved under it in the store): refused at its first entry
    const asAnother = { publicKey: keyOf(c), keyId: c.keyId, earlier, tenantId: 'someone-else' };
    expect(verifyEntries(rotated, asAnother)).to.deep.include({ part: 'chain', seq: 1 });
    expect(await verifyEntriesAsync(rotated, asAnother)).to.deep.include({ part: 'chain', seq: 1 });
  });

  it('appends after a head signed by this key or an earlier one only: an entry of a key the ledger does not know would break its packs', async () => {
    const [a, b] = [signerOf(randomBytes(32)), signerOf(randomBytes(32))];
    const tenant = `unknown-key-${Date.now()}`;
    const item = { kind: 'gate.result', subject: { workspace: '.' }, payload: { ok: true } };
    await ledgerOf({ store, clock: systemClock, signer: a }).append(tenant, [item]);
    // B, not told A is the key it took over from: refused, nothing written
    const refused = await ledgerOf({ store, clock: systemClock, signer: b })
      .append(tenant, [item])
      .then(
        () => null,
        (err: Error) => err,
      );
    expect(refused).to.be.instanceOf(ConflictError);
    expect(refused!.message).to.contain(`signed by key ${a.keyId}`).and.contain('SERVICE_EVIDENCE_PREVIOUS_KEYS');
    expect((await store.evidence.head(tenant))!.seq).to.equal(1);
    // B with A among its earlier keys: a rotation, taken; A after it is refused
    const rotated = signerOf(randomBytes(32), [publicKeyFromPem(a.publicKeyPem)!]);
    expect(await ledgerOf({ store, clock: systemClock, signer: rotated }).append(tenant, [item])).to.have.length(1);
    const back = await ledgerOf({ store, clock: systemClock, signer: a })
      .append(tenant, [item])
      .catch((err: Error) => err);
    expect(back).to.be.instanceOf(ConflictError);
  });

  it('holds a slice of earlier keys alone to the entries after it, up to the first of the current key: one rewritten with a leaked earlier seed is refused', async () => {
    const a = signerOf(randomBytes(32));
    const rotated = signerOf(randomBytes(32), [publicKeyFromPem(a.publicKeyPem)!]);
    const tenant = `anchored-${Date.now()}`;
    const item = (verdict: string) => ({ kind: 'gate.result', subject: { workspace: '.' }, payload: { verdict } });
    await ledgerOf({ store, clock: systemClock, signer: a }).append(tenant, [item('failure'), item('failure')]);
    const ledger = ledgerOf({ store, clock: systemClock, signer: rotated });
    const [one, two] = await store.evidence.list(tenant, { limit: 10 });
    // no entry of the current key yet: nothing to hold the slice to
    expect(await ledger.anchored(tenant, two!)).to.equal(null);
    await ledger.append(tenant, [item('success')]);
    expect(await ledger.anchored(tenant, two!)).to.equal(null);
    expect(await ledger.anchored(tenant, one!), 'through entry 2, signed by A').to.equal(null);
    // entries 1 and 2 made again, chained and signed with A's seed: they verify by themselves, entry 3 does not follow them
    let prev = GENESIS_HASH;
    const forged = [one!, two!].map((e) => {
      const fields = { ...e, payload_digest: `sha256:${'0'.repeat(64)}`, prev_hash: prev };
      const hash = entryHash(fields);
      prev = hash;
      return { ...fields, hash, sig: a.sign(hash) };
    });
    expect(await ledger.anchored(tenant, forged[1]!)).to.deep.include({ part: 'chain', seq: 3 });
  });

  it("reads a slice's payloads a chunk at a time when the service checks it, and still finds a payload changed in any chunk", async () => {
    const signer = signerOf(randomBytes(32));
    const ledger = ledgerOf({ store, clock: systemClock, signer });
    const entries = await ledger.append(
      'chunked',
      Array.from({ length: 600 }, (_, i) => ({ kind: 'gate.result', subject: { workspace: '.' }, payload: { i } })),
    );
    const asked: number[] = [];
    const payloadsOf = (change?: number) => async (chunk: LedgerEntry[]) => {
      asked.push(chunk.length);
      const bodies = new Map(
        (
          await ledger.payloads(
            'chunked',
            chunk.map((e) => e.payload_digest),
          )
        ).map((p) => [p.digest, p.body]),
      );
      const changed = chunk.find((e) => e.seq === change);
      if (changed) bodies.set(changed.payload_digest, '{"i":-1}');
      return bodies;
    };
    expect(await ledger.verify('chunked', entries, payloadsOf())).to.equal(null);
    expect(asked, 'three reads of at most 256 payloads').to.deep.equal([256, 256, 88]);
    expect(await ledger.verify('chunked', entries, payloadsOf(580))).to.deep.include({ part: 'payload', seq: 580 });
    expect(await ledger.verify('another', entries, payloadsOf())).to.deep.include({ part: 'chain', seq: 1 });
  });

  it('never dates an entry before the one it follows, even when the append that read the clock first commits second', async () => {
    const signer = signerOf(randomBytes(32));
    // two appends at once: the first reads 12:00:01, the second 12:00:00, and the second commits... second
    const times = ['2026-11-30T12:00:01.000Z', '2026-11-30T12:00:00.000Z', '2026-11-30T11:59:59.000Z'];
    const ledger = ledgerOf({ store, clock: { now: () => new Date(times.shift()!) }, signer });
    const item = (i: number) => ({ kind: 'gate.result', subject: {}, payload: { i } });
    await ledger.append('clock', [item(1)]);
    await Promise.all([ledger.append('clock', [item(2), item(3)]), ledger.append('clock', [item(4)])]);
    const entries = await ledger.list('clock', { limit: 10 });
    expect(entries.map((e) => e.at)).to.deep.equal(Array(4).fill('2026-11-30T12:00:01.000Z'));
    expect(verifyEntries(entries, { publicKey: publicKeyFromPem(ledger.publicKey.pem)!, keyId: signer.keyId })).to.equal(null);
    // a list from a time finds every entry after the first one dated at or after it
    expect(await ledger.list('clock', { since: '2026-11-30T12:00:01.000Z', limit: 10 })).to.have.length(4);
  });
});
