// npm run bench (part five): the evidence ledger. 10,000 appends, each its own atomic write with its
// hash and Ed25519 signature, then verification of all 10,000 (hashes, links, signatures, payload
// digests), on a fresh SQLite store; against the same 10,000 rows inserted one by one with no hash or
// signature, in the same run. Goals: appends under 1 s, verification under 2 s.
import { randomBytes } from 'node:crypto';
import fs from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import Database from 'better-sqlite3';
import { GENESIS_HASH, ledgerOf, publicKeyFromPem, signerOf, verifyEntries, verifyEntriesAsync } from '../engine/evidence/index.js';
import { systemClock } from '../engine/platform/index.js';
import { openStore } from '../engine/store/index.js';

const N = 10_000;

export async function ledgerBenchmarks(): Promise<string[]> {
  const dir = await fs.mkdtemp(path.join(os.tmpdir(), 'bench-ledger-'));
  const store = await openStore({ dataDir: dir, mongodbUri: undefined });
  try {
    const signer = signerOf(randomBytes(32));
    const ledger = ledgerOf({ store, clock: systemClock, signer });
    const payload = (i: number) => ({ gate_id: `gate-${i % 7}`, conclusion: i % 5 ? 'success' : 'failure', summary: `result ${i}`, duration_ms: i });
    // 10,000 sealed 100 at a time, as a gate run seals its results together (measured first, on a fresh file)
    const tb = performance.now();
    for (let i = 0; i < N / 100; i++)
      await ledger.append(
        'batched',
        Array.from({ length: 100 }, (_, k) => ({ kind: 'gate.result', subject: { workspace: '.', gate_id: `gate-${k % 7}` }, payload: payload(i * 100 + k) })),
      );
    const batchMs = performance.now() - tb;

    const t0 = performance.now();
    for (let i = 0; i < N; i++)
      await ledger.append('bench', [
        { kind: 'gate.result', subject: { workspace: '.', commit: 'a'.repeat(40), gate_id: `gate-${i % 7}` }, payload: payload(i) },
      ]);
    const appendMs = performance.now() - t0;

    const t1 = performance.now();
    const entries = await ledger.list('bench', { limit: N });
    const payloads = new Map(
      (
        await ledger.payloads(
          'bench',
          entries.map((e) => e.payload_digest),
        )
      ).map((p) => [p.digest, p.body]),
    );
    const opts = { publicKey: publicKeyFromPem(ledger.publicKey.pem)!, keyId: signer.keyId, prevHash: GENESIS_HASH, payloads };
    const problem = verifyEntries(entries, opts);
    const verifyMs = performance.now() - t1;
    if (problem || entries.length !== N) throw new Error(`the bench ledger did not verify: ${JSON.stringify(problem)}`);
    // the service's check of the same slice (a pack's): signatures on the thread pool, and how long the event loop stalled meanwhile
    let stallMs = 0;
    let last = performance.now();
    const ticker = setInterval(() => {
      const now = performance.now();
      stallMs = Math.max(stallMs, now - last);
      last = now;
    }, 1);
    const t3 = performance.now();
    const again = await verifyEntriesAsync(entries, opts);
    const verifyAsyncMs = performance.now() - t3;
    clearInterval(ticker);
    stallMs = Math.max(stallMs, performance.now() - last);
    if (again) throw new Error(`the bench ledger did not verify on the thread pool: ${JSON.stringify(again)}`);

    // baseline: the same rows, one insert each, no hash, no signature
    const db = new Database(path.join(dir, 'baseline.db'));
    db.pragma('journal_mode = WAL');
    db.pragma('synchronous = NORMAL');
    db.exec('CREATE TABLE rows (tenant_id TEXT, seq INTEGER, at TEXT, doc TEXT, PRIMARY KEY (tenant_id, seq)) WITHOUT ROWID');
    const insert = db.prepare('INSERT INTO rows VALUES (?, ?, ?, ?)');
    const t2 = performance.now();
    for (let i = 0; i < N; i++) insert.run('bench', i + 1, new Date().toISOString(), JSON.stringify(payload(i)));
    const baselineMs = performance.now() - t2;
    db.close();
    const f = (ms: number) => `${ms.toFixed(0)} ms`;
    return [
      `| 10,000 appends, each atomic, hashed and signed (goal < 1 s) | ${f(appendMs)} | ${f(baselineMs)} (plain inserts) | ${(appendMs / baselineMs).toFixed(1)}x |`,
      `| 10,000 appends sealed 100 at a time (one atomic write each) | ${f(batchMs)} | ${f(baselineMs)} (plain inserts) | ${(batchMs / baselineMs).toFixed(1)}x |`,
      `| verify 10,000 entries: hashes, links, signatures, payload digests (goal < 2 s), the CLI's check | ${f(verifyMs)} | | |`,
      `| the same, the service's check (signatures on the thread pool): time, and the event loop's longest stall | ${f(verifyAsyncMs)}, stall ${f(stallMs)} | | |`,
    ];
  } finally {
    await store.close();
    await fs.rm(dir, { recursive: true, force: true });
  }
}
