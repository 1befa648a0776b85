// Evidence packs: an in-toto Statement (v1) in a DSSE envelope signed with the ledger's key, and, as
// a tar, the ledger entries and payloads it rests on, so that it stands alone. verifyPack checks a
// pack with nothing but its files (and, to pin it, the key id one expects): the envelope's signature,
// the statement's ledger range and head, each entry's hash, link and signature, each payload's digest,
// that every gate result the statement names is the one its entry sealed (a clean tree's, for a clean
// commit), and that a tar is whole: its end-of-archive blocks, and every artifact those results name.
import { Readable } from 'node:stream';
import tar from 'tar-stream';
import type { LedgerEntry } from '../platform/index.js';
import type { KeyObject } from 'node:crypto';
import { keyIdOf, publicKeyFromPem, verifySignature, type EvidenceSigner, type LedgerKey } from './keys.js';
import { canonicalJson, payloadDigest, verifyEntries, type EvidenceProblem } from './verify.js';

export const IN_TOTO_PAYLOAD_TYPE = 'application/vnd.in-toto+json';
export const STATEMENT_TYPE = 'https://in-toto.io/Statement/v1';

export type DsseEnvelope = { payloadType: string; payload: string; signatures: { keyid: string; sig: string }[] };

/** What a statement's predicate says of the ledger and of each gate, as far as verification needs. */
export type PackPredicate = {
  /** `earlier_keys`: the ledger's keys before a rotation that signed entries of the range, vouched for by the pack's signature */
  ledger: { from_seq: number; to_seq: number; head_hash: string; key_id: string; earlier_keys?: LedgerKey[] } | null;
  gates: { gate_id: string; ledger_seq: number; payload_digest: string; [field: string]: unknown }[];
  ready?: boolean;
  missing?: string[];
  subject?: { commit?: string | null; dirty?: boolean | null };
  gate_runs?: { gate_run_id: string; ledger?: { to_seq: number } | null }[];
  [more: string]: unknown;
};

/** The fields of a gate's row in a statement that must be what its ledger entry seals. */
const SEALED_FIELDS = ['conclusion', 'required', 'summary', 'input_digest', 'definition_digest'] as const;

export type Statement = {
  _type: string;
  subject: { name: string; digest: Record<string, string> }[];
  predicateType: string;
  predicate: PackPredicate;
};

/** DSSE's pre-authentication encoding: what is signed. */
export function pae(payloadType: string, payload: Buffer): Buffer {
  const type = Buffer.from(payloadType);
  return Buffer.concat([Buffer.from(`DSSEv1 ${type.length} `), type, Buffer.from(` ${payload.length} `), payload]);
}

export function envelopeOf(statement: Statement, signer: EvidenceSigner): DsseEnvelope {
  const payload = Buffer.from(JSON.stringify(statement));
  return {
    payloadType: IN_TOTO_PAYLOAD_TYPE,
    payload: payload.toString('base64'),
    signatures: [{ keyid: signer.keyId, sig: signer.sign(pae(IN_TOTO_PAYLOAD_TYPE, payload)) }],
  };
}

/** A pack as JSON: the envelope, the public key, and the statement it signs (for reading; verification uses the envelope's). */
export type PackJson = { envelope: DsseEnvelope; public_key: { key_id: string; pem: string }; statement: Statement };

/** A payload a pack's tar carries, by its digest. */
export type PackPayload = { digest: string; body: string };

/**
 * A pack's files as a tar, streamed: pack.json, public-key.pem, ledger.jsonl and payloads/<hex>.json. A
 * payload is taken from `payloads` only once the reader has taken the one before (tar-stream holds an entry
 * until it is read), so a pack of hundreds of megabytes of artifacts holds about one of them in memory.
 * Destroying the stream (the client went away) stops taking payloads: the iterator is returned.
 */
export function packTar(pack: PackJson, entries: LedgerEntry[], payloads: Iterable<PackPayload> | AsyncIterable<PackPayload>): Readable {
  const p = tar.pack();
  // entry() throws once the pack is destroyed, and an entry destroyed with it fails its callback: the promise
  // rejects, and the loop below ends. Its error event, also emitted, would be thrown with no listener.
  const add = (name: string, text: string) =>
    new Promise<void>((resolve, reject) => {
      p.entry({ name, mode: 0o644 }, text, (err) => (err ? reject(err) : resolve())).on('error', () => undefined);
    });
  const write = async () => {
    await add('pack.json', `${JSON.stringify(pack, null, 2)}\n`);
    await add('public-key.pem', pack.public_key.pem);
    await add('ledger.jsonl', entries.map((e) => JSON.stringify(e)).join('\n') + '\n');
    for await (const { digest, body } of payloads) await add(`payloads/${digest.replace(/^sha256:/, '')}.json`, body);
    p.finalize();
  };
  write().catch((err: unknown) => p.destroy(err instanceof Error ? err : new Error(String(err))));
  // a Node stream (tar-stream's is streamx's), in bytes: it asks for the next entry only once its own buffer is taken
  return Readable.from(p, { objectMode: false });
}

export type PackFiles = { pack: PackJson; publicKeyPem: string; entries: LedgerEntry[] | null; payloads: Map<string, string> | null };

/** Reads a pack: a tar of its files, or pack.json alone. Throws when it is neither. */
export async function readPack(data: Buffer): Promise<PackFiles> {
  // pack.json as an editor or a pipe may leave it (a byte-order mark, leading white space); a tar starts with a file's name
  const text = /^(\uFEFF)?\s*\{/.test(data.subarray(0, 64).toString('utf8')) ? data.toString('utf8').replace(/^\uFEFF/, '') : null;
  if (text !== null) {
    const pack = JSON.parse(text) as PackJson;
    return { pack, publicKeyPem: pack.public_key?.pem ?? '', entries: null, payloads: null };
  }
  const files = new Map<string, string>();
  const extract = tar.extract();
  /** where the last entry's data (padded to its 512-byte block) ends: the end-of-archive marker comes after it */
  let dataEnd = 0;
  await new Promise<void>((resolve, reject) => {
    extract.on('entry', (header, stream, next) => {
      const parts: Buffer[] = [];
      const offset = (header as { byteOffset?: number }).byteOffset;
      if (typeof offset === 'number') dataEnd = offset + Math.ceil((header.size ?? 0) / 512) * 512;
      // a tar cut in the middle of a file ends its entry's stream with an error ("Unexpected end of data"),
      // which with no listener was thrown out of the reader, uncaught
      stream.on('error', reject);
      stream.on('data', (c: unknown) => parts.push(c as Buffer));
      stream.on('end', () => {
        // files only (a tar made again with GNU tar has an entry for the payloads/ folder), named as
        // packTar names them (GNU tar's `-C dir .` writes ./pack.json)
        if (header.type === 'file') files.set(header.name.replace(/^(\.\/)+/, ''), Buffer.concat(parts).toString('utf8'));
        next();
      });
      stream.resume();
    });
    extract.on('finish', resolve);
    extract.on('error', reject);
    Readable.from([data]).pipe(extract);
  });
  // a tar cut at the end of an entry reads as a whole one with fewer files: its end-of-archive marker (two
  // blocks of zeros after the last entry) is what says that nothing was cut off
  if (data.length < dataEnd + 1024 || data.subarray(dataEnd, dataEnd + 1024).some((b) => b !== 0))
    throw new Error('the tar has no end-of-archive marker after its last file: it was cut short');
  const packText = files.get('pack.json');
  if (!packText) throw new Error('the pack has no pack.json');
  const payloads = new Map<string, string>();
  for (const [name, body] of files) if (name.startsWith('payloads/')) payloads.set(`sha256:${name.slice(9).replace(/\.json$/, '')}`, body);
  const ledger = files.get('ledger.jsonl');
  return {
    pack: JSON.parse(packText) as PackJson,
    publicKeyPem: files.get('public-key.pem') ?? '',
    entries:
      ledger === undefined
        ? null
        : ledger
            .split('\n')
            .filter(Boolean)
            .map((l) => JSON.parse(l) as LedgerEntry),
    payloads,
  };
}

export type PackVerdict =
  | { ok: true; statement: Statement; key_id: string; entries: number; /** earlier keys that signed entries, vouched for by key_id */ earlier_keys: string[] }
  | { ok: false; problem: EvidenceProblem };

/** The 32 bytes of an Ed25519 public key. */
const rawOf = (key: KeyObject): Buffer => key.export({ format: 'der', type: 'spki' }).subarray(-32);

/**
 * Checks a pack's files. `publicKey` pins the key it must be signed with; `keyId` pins the key's id only (the
 * first 64 bits of its digest: a key made to match an id is out of reach of most, not of all).
 */
export function verifyPack(files: PackFiles, opts: { keyId?: string; publicKey?: KeyObject; tenantId?: string } = {}): PackVerdict {
  const fail = (problem: EvidenceProblem): PackVerdict => ({ ok: false, problem });
  const publicKey = publicKeyFromPem(files.publicKeyPem);
  if (!publicKey) return fail({ part: 'envelope', message: 'the pack has no Ed25519 public key' });
  const keyId = keyIdOf(publicKey);
  if (opts.keyId && opts.keyId !== keyId) return fail({ part: 'envelope', message: `the pack is signed by key ${keyId}, not ${opts.keyId}` });
  if (opts.publicKey && !rawOf(opts.publicKey).equals(rawOf(publicKey)))
    return fail({ part: 'envelope', message: `the pack is signed by key ${keyId}, not the public key given (key ${keyIdOf(opts.publicKey)})` });
  const env = files.pack.envelope;
  const sig = env?.signatures?.find((s) => s.keyid === keyId);
  if (!env || env.payloadType !== IN_TOTO_PAYLOAD_TYPE || !sig) return fail({ part: 'envelope', message: `the envelope has no signature by key ${keyId}` });
  const payload = Buffer.from(env.payload, 'base64');
  if (!verifySignature(publicKey, pae(env.payloadType, payload), sig.sig))
    return fail({ part: 'envelope', message: "the envelope's signature does not verify" });
  let statement: Statement;
  try {
    statement = JSON.parse(payload.toString('utf8')) as Statement;
  } catch {
    return fail({ part: 'statement', message: 'the signed statement is not JSON' });
  }
  if (statement._type !== STATEMENT_TYPE) return fail({ part: 'statement', message: `the statement is not an in-toto ${STATEMENT_TYPE}` });
  // one key signs every tenant's packs: the tenant a pack is about is part of what is signed
  const tenant = statement.predicate?.tenant_id;
  if (opts.tenantId && tenant !== opts.tenantId)
    return fail({ part: 'statement', message: `the pack is tenant ${typeof tenant === 'string' ? tenant : '(none named)'}'s, not ${opts.tenantId}'s` });
  // what the pack shows for reading must be what was signed
  if (files.pack.statement !== undefined && canonicalJson(files.pack.statement) !== canonicalJson(statement))
    return fail({ part: 'statement', message: 'the readable statement in pack.json differs from the signed one' });
  if (files.pack.public_key && (files.pack.public_key.pem !== files.publicKeyPem || files.pack.public_key.key_id !== keyId))
    return fail({ part: 'envelope', message: 'the public key in pack.json differs from the one the pack is checked with' });
  for (const [digest, body] of files.payloads ?? [])
    if (payloadDigest(body) !== digest) return fail({ part: 'payload', message: `payload ${digest} does not match its digest` });
  const range = statement.predicate?.ledger;
  // a tar carries its ledger slice: one without it proves nothing of the entries its statement names
  if (files.payloads && !files.entries) return fail({ part: 'chain', message: 'the pack has no ledger.jsonl' });
  if (!files.entries || !range) return { ok: true, statement, key_id: keyId, entries: 0, earlier_keys: [] };
  const entries = files.entries;
  if (range.key_id !== keyId) return fail({ part: 'statement', message: `the statement names key ${range.key_id}, not the pack's ${keyId}` });
  // the keys the ledger had before a rotation, as the signed statement names them: each must be the key its id says
  const earlier = new Map<string, KeyObject>();
  for (const k of Array.isArray(range.earlier_keys) ? range.earlier_keys : []) {
    const key = publicKeyFromPem(typeof k?.pem === 'string' ? k.pem : '');
    if (!key || keyIdOf(key) !== k.key_id)
      return fail({ part: 'statement', message: `the statement's earlier key ${String(k?.key_id)} is not the Ed25519 key its id names` });
    earlier.set(k.key_id, key);
  }
  const problem = verifyEntries(entries, {
    publicKey,
    keyId,
    earlier,
    payloads: files.payloads ?? new Map(),
    ...(typeof tenant === 'string' ? { tenantId: tenant } : {}),
  });
  if (problem) return fail(problem);
  if (entries[0]?.seq !== range.from_seq || entries.at(-1)?.seq !== range.to_seq)
    return fail({
      part: 'chain',
      message: `the ledger slice is ${entries[0]?.seq ?? '-'}..${entries.at(-1)?.seq ?? '-'}, the statement names ${range.from_seq}..${range.to_seq}`,
    });
  if (entries.at(-1)!.hash !== range.head_hash)
    return fail({ part: 'chain', seq: range.to_seq, message: "the ledger slice does not end at the statement's head hash" });
  const gates = statement.predicate.gates ?? [];
  /** the artifacts the sealed results name that the tar does not carry, with their gates */
  const absent: string[] = [];
  for (const g of gates) {
    const e = entries.find((x) => x.seq === g.ledger_seq);
    if (!e || e.kind !== 'gate.result' || e.payload_digest !== g.payload_digest || e.subject.gate_id !== g.gate_id)
      return fail({ part: 'statement', seq: g.ledger_seq, message: `gate ${g.gate_id} names entry ${g.ledger_seq}, which does not seal its result` });
    // what the statement says of the gate is what was sealed (the entries verified above, their payloads are there)
    const sealed = JSON.parse(files.payloads!.get(e.payload_digest)!) as Record<string, unknown>;
    const differs = SEALED_FIELDS.find((f) => f in g && canonicalJson(g[f] ?? null) !== canonicalJson(sealed[f] ?? null));
    if (differs)
      return fail({ part: 'statement', seq: g.ledger_seq, message: `gate ${g.gate_id}'s ${differs} in the statement is not what entry ${g.ledger_seq} seals` });
    // and it was sealed for the commit the statement is about
    const commit = statement.predicate.subject?.commit;
    if (commit && e.subject.commit !== commit)
      return fail({
        part: 'statement',
        seq: g.ledger_seq,
        message: `gate ${g.gate_id} was sealed for commit ${String(e.subject.commit)}, not the statement's ${commit}`,
      });
    // a pack of a clean commit holds only results of a clean tree: one whose tree changed before or while its
    // gate ran tested that tree, not the commit
    if (statement.predicate.subject?.dirty === false && e.subject.dirty !== false)
      return fail({
        part: 'statement',
        seq: g.ledger_seq,
        message: `gate ${g.gate_id} was sealed for a tree with changes (entry ${g.ledger_seq}), not the clean commit the statement names`,
      });
    // and the tar carries every artifact its sealed result names: a tar cut short, or stripped of them, is not the pack
    const artifacts = Array.isArray(sealed.artifacts) ? (sealed.artifacts as { payload_digest?: unknown }[]) : [];
    for (const a of artifacts)
      if (typeof a?.payload_digest !== 'string' || !files.payloads!.has(a.payload_digest)) absent.push(`${String(a?.payload_digest)} (gate ${g.gate_id})`);
  }
  if (absent.length) return fail({ part: 'payload', message: `the pack lacks the artifacts its sealed results name: ${absent.join(', ')}` });
  // the gates missing are those the latest run's seal names as required and the statement has no result of
  const latestRun = statement.predicate.gate_runs?.[0];
  const seal = latestRun?.ledger ? entries.find((x) => x.seq === latestRun.ledger!.to_seq) : undefined;
  if (latestRun && (!seal || seal.kind !== 'gate.run' || seal.subject.gate_run_id !== latestRun.gate_run_id))
    return fail({ part: 'statement', message: `gate run ${latestRun.gate_run_id} names no seal of its own in the ledger slice` });
  const required = seal ? (JSON.parse(files.payloads!.get(seal.payload_digest)!) as { required_gates?: unknown }).required_gates : undefined;
  if (Array.isArray(required)) {
    const missing = required.filter((id) => !gates.some((g) => g.gate_id === id)).sort();
    if (canonicalJson(missing) !== canonicalJson([...(statement.predicate.missing ?? [])].sort()))
      return fail({
        part: 'statement',
        message: `the statement says ${JSON.stringify(statement.predicate.missing ?? [])} are missing; the seal of its latest run says ${JSON.stringify(missing)}`,
      });
  }
  // and its verdict follows from them: every required gate sealed a success, and none is missing
  const ready = !(statement.predicate.missing ?? []).length && gates.every((g) => !g.required || g.conclusion === 'success');
  if (statement.predicate.ready !== undefined && statement.predicate.ready !== ready)
    return fail({ part: 'statement', message: `the statement says ready: ${String(statement.predicate.ready)}, but its sealed gates say ${String(ready)}` });
  return {
    ok: true,
    statement,
    key_id: keyId,
    entries: entries.length,
    earlier_keys: [...earlier.keys()].filter((id) => entries.some((e) => e.key_id === id)),
  };
}
