// The evidence pack of a workspace: the latest result of each gate for one subject (a commit, by
// default the latest one sealed), the gate runs and runs that produced them, and the ledger range
// that seals them (with the summaries of the workspace's audits sealed in that range), as an in-toto Statement in a DSSE envelope signed with the ledger's key. As a tar
// it carries the ledger slice and every payload it names, so it can be checked offline.
import path from 'node:path';
import { setImmediate as turn } from 'node:timers/promises';
import { STATEMENT_TYPE, type Ledger, type PackJson, type Statement } from '../evidence/index.js';
import type { Platform } from '../deps.js';
import {
  admission,
  ConflictError,
  NotFoundError,
  ValidationError,
  type GateResult,
  type GateRunRecord,
  type GateSubject,
  type LedgerEntry,
} from '../platform/index.js';
import type { GateRuns } from './gate-runs.js';
import { staysInside } from './paths.js';

export const PREDICATE_TYPE = 'https://automation-backend.dev/evidence-pack/v1';
const RUNS_SCANNED = 500;
/** gate runs read at a time: each may be megabytes */
const PAGE = 20;
const SLICE_MAX = 10_000;

/**
 * A pack and what its tar rests on: the ledger slice, and the digests of the slice's payloads and of its gates'
 * artifacts, read only for a tar, a few at a time (`payloadsOf`): 50 gates of 5 MB each, 10,000 payloads of 72 KB.
 */
export type EvidencePack = { pack: PackJson; entries: LedgerEntry[]; payloads: string[]; artifacts: string[] };

/**
 * Packs a process checks at once (each reads and verifies up to SLICE_MAX entries and their payloads: a second
 * of CPU and of the thread pool, whose file reads every request shares), and a tenant's share of them. Twelve
 * at once had held a list of runs in the same process 330 ms at the median and 3 s at worst.
 */
const PACKS_AT_ONCE = 4;
const PACKS_TENANT_SHARE = 2;
const PACKS_RETRY_AFTER_SECONDS = 2;

/** How many payloads a tar's writer is given from one read of the store. */
const PAYLOADS_READ = 64;

/** A workspace as the records name it (relative to the tenant's root, normalized), or null for one no record names. */
function storedName(requested: string): string | null {
  const name = path.posix.normalize(requested).replace(/\/+$/, '');
  return name && name !== '.' && staysInside(name) ? name : null;
}

export function evidencePacksOf(deps: Pick<Platform, 'store' | 'clock'> & { ledger: Ledger; gates: GateRuns }) {
  const { store, clock, ledger, gates } = deps;
  const checking = admission({ max: PACKS_AT_ONCE, tenantShare: PACKS_TENANT_SHARE, what: 'evidence packs', retryAfterSeconds: PACKS_RETRY_AFTER_SECONDS });

  /**
   * The gate runs a pack is about, newest first, and the latest result of each gate among them with the entry
   * that sealed it: for one commit (by default the latest one sealed), every clean sealed run of it; with none,
   * or outside a repository, the latest run alone. The runs are read a page at a time and kept without their
   * results (only the entries of the results a pack shows): a workspace's last RUNS_SCANNED gate runs, whole,
   * could be gigabytes (50 gates a set, each with its output and annotations).
   */
  async function packRuns(
    tenantId: string,
    workspace: string,
    q: { subject?: string; since?: string },
  ): Promise<{ runs: GateRunRecord[]; latest: Map<string, GateRunRecord> }> {
    // an instant, whatever offset it was written with (compared as text, +02:00 and Z disagreed)
    const from = q.since ? Date.parse(q.since) : Number.NEGATIVE_INFINITY;
    let commit: string | null | undefined = q.subject;
    // a subject may be a prefix of the commit or tree (7 or more hex characters)
    const named = (hash: string | null | undefined) => Boolean(commit && hash?.startsWith(commit));
    // a run of a tree with uncommitted changes tested that tree, not the commit: the commit's results come
    // from its clean runs only; with none, the latest run stands alone for what it tested (dirty)
    const clean: GateRunRecord[] = [];
    const ofClean = new Map<string, GateRunRecord>();
    let first: { run: GateRunRecord; latest: Map<string, GateRunRecord> } | undefined;
    /**
     * The run of the latest result of each gate (the entry that sealed it is found in the run's slice of the
     * ledger); of a clean commit, only results of a clean tree: a gate run that began clean may have a gate that
     * began after another changed the tree, or whose tree changed while it ran (its result says dirty)
     */
    const addLatest = (latest: Map<string, GateRunRecord>, run: GateRunRecord, light: GateRunRecord, cleanOnly = false) =>
      run.results.forEach((result) => {
        if (cleanOnly && result.subject?.dirty !== false) return;
        if (!latest.has(result.gate_id)) latest.set(result.gate_id, light);
      });
    let scanned = 0;
    let cursor: string | undefined;
    scan: while (scanned < RUNS_SCANNED) {
      const page = await store.gateRuns.list(tenantId, { workspace, limit: PAGE, cursor });
      for (const r of page.items) {
        if (!r.ledger || (r.status !== 'succeeded' && r.status !== 'failed') || !(r.finished_at ? Date.parse(r.finished_at) >= from : !q.since)) continue;
        if (++scanned > RUNS_SCANNED) break scan;
        if (commit === undefined) commit = r.subject?.commit ?? null;
        if (commit && !named(r.subject?.commit) && !named(r.subject?.tree)) continue;
        const light = { ...r, results: [] };
        if (!first) {
          first = { run: light, latest: new Map() };
          addLatest(first.latest, r, light);
        }
        // outside a repository, the latest run alone
        if (!commit) break scan;
        if (r.subject?.dirty === false) {
          clean.push(light);
          addLatest(ofClean, r, light, true);
        }
      }
      if (!page.next_cursor) break;
      cursor = page.next_cursor;
    }
    if (clean.length) return { runs: clean, latest: ofClean };
    return first ? { runs: [first.run], latest: first.latest } : { runs: [], latest: new Map() };
  }

  /** The pack of `build`, once it holds a place for its check. */
  async function buildChecked(tenantId: string, q: { workspace?: string; subject?: string; since?: string }): Promise<EvidencePack> {
    const ws = await gates.workspaceOf(tenantId, q.workspace, '/query/workspace').catch(async (err: unknown) => {
      // a folder gone since its gate runs were sealed (a run's checkout, removed as its attempt ended): its
      // name as the gate runs keep it, read only from the tenant's records, never from the disk
      const name = q.workspace === undefined ? null : storedName(q.workspace);
      if (err instanceof ValidationError && name && (await store.gateRuns.list(tenantId, { workspace: name, limit: 1 })).items.length) return { name };
      throw err;
    });
    const { runs, latest } = await packRuns(tenantId, ws.name, q);
    if (!runs.length)
      throw new NotFoundError(`no sealed gate run of workspace ${ws.name}${q.subject ? ` for ${q.subject}` : ''}${q.since ? ` since ${q.since}` : ''}`);
    const from = Math.min(...runs.map((r) => r.ledger!.from_seq));
    const to = Math.max(...runs.map((r) => r.ledger!.to_seq));
    // a pack holds the whole slice its results are sealed in, or it would not verify: a longer one is refused
    if (to - from + 1 > SLICE_MAX)
      throw new ValidationError(`the gate runs of this pack are sealed across ${to - from + 1} ledger entries, more than the ${SLICE_MAX} a pack holds`, [
        { path: '/query/since', message: 'name a later since, so that fewer gate runs are packed' },
      ]);
    const entries = await ledger.list(tenantId, { afterSeq: from - 1, limit: to - from + 1 });
    const head = entries.at(-1)!;
    const bySeq = new Map(entries.map((e) => [e.seq, e]));
    // what the statement reads of the slice's payloads: the latest gate results, the latest run's seal and the
    // workspace's audits. The rest (up to 10,000 payloads of up to 72 KB) are read to be checked and let go:
    // held together, six packs at once took the process past its heap
    const sealAt = runs[0]!.ledger!.to_seq;
    const read = (e: LedgerEntry) =>
      e.seq === sealAt || (e.kind === 'gate.result' && latest.has(String(e.subject.gate_id))) || (e.kind === 'audit.report' && e.subject.workspace === ws.name);
    const payloadOf = new Map<string, string>();
    // the service signs only what its ledger seals: a slice that does not verify as stored is refused,
    // and each gate's row is its sealed result, never the gate run's stored copy of it; and what follows the slice,
    // up to the current key's first entry after it, must chain to it (a slice of earlier keys alone, rewritten)
    const problem =
      (await ledger.verify(tenantId, entries, async (chunk) => {
        const bodies = new Map((await ledger.payloads(tenantId, [...new Set(chunk.map((e) => e.payload_digest))])).map((p) => [p.digest, p.body]));
        for (const e of chunk) if (read(e) && bodies.has(e.payload_digest)) payloadOf.set(e.payload_digest, bodies.get(e.payload_digest)!);
        return bodies;
      })) ?? (await ledger.anchored(tenantId, head));
    if (problem) throw new ConflictError(`the evidence ledger does not verify (${problem.message}); no pack is signed from it`, { problem });
    // entries signed before the ledger's key was rotated: the pack names their keys, and its signature vouches for them
    const earlier = ledger.earlierKeysOf(entries);
    const earlierKeys = earlier.length ? { earlier_keys: earlier } : {};
    /**
     * The gate's sealed result among its run's entries (from_seq to to_seq). Not from_seq plus its place: on
     * MongoDB a seal whose batch another writer cut into is built on around that writer's entries, and the
     * pack of that commit was refused for good (409), its entries counted from from_seq.
     */
    const sealedResult = (run: GateRunRecord, gateId: string, cleanOnly: boolean): { seq: number; result: GateResult } => {
      for (let seq = run.ledger!.from_seq; seq <= run.ledger!.to_seq; seq++) {
        const entry = bySeq.get(seq);
        if (entry?.kind !== 'gate.result' || entry.subject.gate_id !== gateId || (entry.subject.gate_run_id ?? run.id) !== run.id) continue;
        // a pack of a clean commit signs only what the ledger sealed as a clean tree's (the record chose the row)
        if (cleanOnly && entry.subject.dirty !== false)
          throw new ConflictError(
            `gate ${gateId} of gate run ${run.id} was sealed for a tree with changes (entry ${seq}), not the clean commit; no pack is signed`,
          );
        const body = payloadOf.get(entry.payload_digest);
        if (body !== undefined) return { seq, result: JSON.parse(body) as GateResult };
      }
      throw new ConflictError(
        `the ledger has no sealed result of gate ${gateId} of gate run ${run.id} (entries ${run.ledger!.from_seq} to ${run.ledger!.to_seq}); no pack is signed`,
      );
    };
    // what the latest run tested, and the required gates of the set as it saw them, as its seal says (a run
    // sealed before the seal held the required gates: as stored); one with no result for the commit blocks
    const seal = bySeq.get(runs[0]!.ledger!.to_seq);
    if (!seal || seal.kind !== 'gate.run' || seal.subject.gate_run_id !== runs[0]!.id)
      throw new ConflictError(`the ledger has no seal of gate run ${runs[0]!.id} at entry ${runs[0]!.ledger!.to_seq}; no pack is signed`);
    const sealedRun = JSON.parse(payloadOf.get(seal.payload_digest) ?? '{}') as { required_gates?: string[] | null };
    const sealedSubject = seal.subject as Partial<GateSubject>;
    const subject: GateSubject = {
      workspace: sealedSubject.workspace ?? ws.name,
      commit: sealedSubject.commit ?? null,
      tree: sealedSubject.tree ?? null,
      dirty: sealedSubject.dirty ?? null,
    };
    // artifacts are payloads too: the tar carries them so that it stands alone (payloadsOf reads them)
    const rows = [...latest].map(([gateId, run]) => ({ run, ...sealedResult(run, gateId, subject.dirty === false) }));
    const sliceDigests = [...new Set(entries.map((e) => e.payload_digest))];
    const inSlice = new Set(sliceDigests);
    const artifacts = [...new Set(rows.flatMap(({ result }) => result.artifacts.map((a) => a.payload_digest)))].filter((d) => !inSlice.has(d));
    // every row's result sealed for the commit the pack names, as `gates verify` holds it to: a gate run that
    // mixed commits (sealed before gate runs were held to one) is refused, not signed
    for (const { result, seq } of rows) {
      const sealedFor = bySeq.get(seq)?.subject.commit;
      if (subject.commit && sealedFor !== subject.commit)
        throw new ConflictError(`gate ${result.gate_id} was sealed for commit ${String(sealedFor)}, not ${subject.commit}; no pack is signed`);
    }
    const required = sealedRun.required_gates ?? runs[0]!.required_gates ?? [];
    const missing = required.filter((id) => !latest.has(id));
    const gateRows = rows.map(({ result, run, seq }) => ({
      gate_id: result.gate_id,
      name: result.name,
      required: result.required,
      conclusion: result.conclusion,
      summary: result.summary,
      finished_at: result.finished_at,
      input_digest: result.input_digest,
      definition_digest: result.definition_digest,
      gate_run_id: run.id,
      ledger_seq: seq,
      payload_digest: bySeq.get(seq)?.payload_digest ?? '',
    }));
    // the audits of the workspace sealed within the same slice: their summaries, by ledger entry
    const audits = entries
      .filter((e) => e.kind === 'audit.report' && e.subject.workspace === ws.name && payloadOf.has(e.payload_digest))
      .map((e) => {
        const p = JSON.parse(payloadOf.get(e.payload_digest)!) as { report_id: string; status: string; totals: Record<string, number>; finished_at: string };
        return {
          report_id: p.report_id,
          status: p.status,
          totals: p.totals,
          finished_at: p.finished_at,
          ledger_seq: e.seq,
          payload_digest: e.payload_digest,
        };
      });
    const statement: Statement = {
      _type: STATEMENT_TYPE,
      subject: [
        {
          name: `workspace:${ws.name}`,
          digest: subject.commit
            ? { gitCommit: subject.commit, ...(subject.tree ? { gitTree: subject.tree } : {}) }
            : { sha256: (gateRows[0]?.input_digest ?? '').replace(/^sha256:/, '') },
        },
      ],
      predicateType: PREDICATE_TYPE,
      predicate: {
        workspace: ws.name,
        generated_at: clock.now().toISOString(),
        subject,
        ready: !missing.length && gateRows.every((g) => !g.required || g.conclusion === 'success'),
        tenant_id: tenantId,
        missing,
        gates: gateRows,
        gate_runs: runs.map((r) => ({ gate_run_id: r.id, status: r.status, trigger: r.trigger, finished_at: r.finished_at, ledger: r.ledger })),
        runs: [...new Set(runs.flatMap((r) => (r.trigger.type === 'run' ? [r.trigger.run_id] : [])))],
        audits,
        ledger: { from_seq: entries[0]!.seq, to_seq: head.seq, head_hash: head.hash, key_id: ledger.publicKey.key_id, ...earlierKeys },
      },
    };
    return {
      pack: { envelope: ledger.envelope(statement), public_key: ledger.publicKey, statement },
      entries,
      payloads: sliceDigests,
      artifacts,
    };
  }

  return {
    /** The pack, checked: in one of the process's places for a check (PACKS_AT_ONCE), or refused at once. */
    build(tenantId: string, q: { workspace?: string; subject?: string; since?: string }): Promise<EvidencePack> {
      // RFC 3339's grammar takes a leap second (23:59:60), which no Date holds: no instant to compare with
      if (q.since !== undefined && !Number.isFinite(Date.parse(q.since)))
        throw new ValidationError('since is not a date and time this service can compare', [{ path: '/query/since', message: 'an RFC 3339 date and time' }]);
      return checking.hold(tenantId, () => buildChecked(tenantId, q));
    },

    /**
     * The payloads a pack's tar carries, as its writer takes them: the slice's, then each artifact read from
     * the store only when asked for, one at a time, with a turn of the event loop before each (a SQLite read
     * is synchronous), so that a pack of hundreds of megabytes neither holds them together nor holds up the
     * other requests. A writer that stops asking (its client went away) stops the reads. An artifact the
     * store does not keep fails the tar (the route cuts its connection): a pack without an artifact its sealed
     * results name is not whole, and was served as if it were.
     */
    async *payloadsOf(tenantId: string, built: EvidencePack): AsyncGenerator<{ digest: string; body: string }> {
      for (let i = 0; i < built.payloads.length; i += PAYLOADS_READ) {
        await turn();
        const page = built.payloads.slice(i, i + PAYLOADS_READ);
        const found = await ledger.payloads(tenantId, page);
        // checked as the pack was built: one gone since (the store's data lost) fails the tar, not a tar without it
        if (found.length !== page.length) throw new Error(`the store no longer keeps every payload of the pack's ledger slice`);
        yield* found;
      }
      for (const digest of built.artifacts) {
        await turn();
        const [payload] = await ledger.payloads(tenantId, [digest]);
        if (!payload) throw new Error(`the store keeps no artifact ${digest} that the pack's sealed results name`);
        yield payload;
      }
    },
  };
}

export type EvidencePacks = ReturnType<typeof evidencePacksOf>;
