// `gates run` and `gates verify`: the same gate set the service runs, run here in-process (each
// command in the sandbox), and offline verification of an evidence pack.
import type { KeyObject } from 'node:crypto';
import { existsSync } from 'node:fs';
import fs from 'node:fs/promises';
import path from 'node:path';
import { environmentValue, loadConfig, TENANT_ID_PATTERN } from '../config/env.js';
import {
  assertSignsAfter,
  EVIDENCE_KEY_FILE,
  ledgerOf,
  publicKeyFromText,
  readPack,
  signerOf,
  verifyPack,
  type EvidenceSigner,
} from '../engine/evidence/index.js';
import {
  FileHasher,
  gateEnv,
  gitState,
  loadGateSet,
  runGateSet,
  sealGateRun,
  subjectOf,
  type ArtifactPayload,
  type GateContext,
} from '../engine/gates/index.js';
import {
  ConflictError,
  createLogger,
  stderrDestination,
  loadKeyBytes,
  newId,
  systemClock,
  type GateResult,
  type GateRunRecord,
} from '../engine/platform/index.js';
import { tenantRootPath } from '../engine/runs/index.js';
import { openStore } from '../engine/store/index.js';
import { openSandbox } from '../engine/tools/index.js';
import { UsageError } from './client.js';
import { visible } from './output.js';

const MARK: Record<GateResult['conclusion'], string> = {
  success: 'ok  ',
  failure: 'FAIL',
  neutral: 'info',
  cancelled: 'stop',
  skipped: 'skip',
  timed_out: 'TIME',
};

/** Runs the gates of a workspace; the exit code is 1 when a required gate does not pass. */
export type GatesRunOptions = { workspace?: string; only?: string[]; json?: boolean; record?: boolean; tenant?: string };

export async function gatesRun(values: GatesRunOptions, out: (text: string) => void): Promise<number> {
  // a local run reads the sandbox's settings only (NODE_ENV=production is common in CI images); --record opens
  // the service's store and ledger with the service's own rules (record, below)
  const config = loadConfig({ service: false });
  const dir = await fs.realpath(path.resolve(values.workspace ?? '.')).catch(() => {
    throw new UsageError(`--workspace ${values.workspace} is not a folder`);
  });
  // recorded results name the workspace as the service does: relative to the tenant's root
  let workspaceName = path.basename(dir);
  if (values.record) {
    if (!values.tenant) throw new UsageError('--record needs --tenant: the results join that tenant’s ledger');
    // the tenant ids an API key can have: results recorded under another would never reach the tenant's pack
    if (!TENANT_ID_PATTERN.test(values.tenant)) throw new UsageError('--tenant: letters, digits, _ or -, at most 64');
    const root = await fs
      .realpath(tenantRootPath({ workspaceRoot: config.workspaceRoot, singleTenant: config.auth === 'none' }, values.tenant))
      .catch(() => '');
    if (!root || (dir !== root && !dir.startsWith(root + path.sep)))
      throw new UsageError(`--workspace must be inside the tenant's workspace root (${root || 'missing'})`);
    workspaceName = path.relative(root, dir) || '.';
    // before the gates run (minutes): a record that could not reach the service's ledger is refused at once
    await requireServiceLedger(values.tenant);
  }
  const sandbox = openSandbox({
    mode: config.sandbox.mode,
    limits: config.sandbox.limits,
    // one folder of step groups for every run of the command, as a deployment has one: a folder a run of its
    // own (cli-<pid>) stayed on the host for good, one more each time
    prefix: 'cli',
    pathVar: config.childEnv.PATH,
    log: createLogger('warn', stderrDestination()),
  });
  const controller = new AbortController();
  const stop = () => controller.abort();
  process.once('SIGINT', stop);
  try {
    const set = await loadGateSet(dir);
    const unknown = (values.only ?? []).filter((id) => !set.gates.some((g) => g.id === id));
    if (unknown.length) throw new UsageError(`no gate ${unknown.join(', ')} in ${set.source} (${set.gates.map((g) => g.id).join(', ')})`);
    const gates = set.gates.filter((g) => !values.only?.length || values.only.includes(g.id));
    const git = await gitState(sandbox, dir);
    const ctx: GateContext = {
      sandbox,
      workspace: dir,
      workspaceName,
      git,
      hasher: new FileHasher(),
      baseEnv: config.childEnv,
      envValue: gateEnv(environmentValue),
      // as in the service: the network is off, so the CLI and the service give the same results
      network: false,
      signal: controller.signal,
    };
    if (!values.json)
      out(`gates of ${dir} (${set.source}${git.commit ? `, ${git.commit.slice(0, 12)}${git.dirty ? ' with changes' : ''}` : ''}): ${gates.length}\n`);
    const { results: ordered, artifacts } = await runGateSet(gates, ctx, {
      concurrency: config.gatesConcurrency,
      onResult: (r) => {
        if (!values.json)
          out(
            `${visible(`  ${MARK[r.conclusion]}  ${r.gate_id.padEnd(20)} ${(r.duration_ms / 1000).toFixed(1).padStart(6)} s  ${r.summary}${r.required ? '' : ' (optional)'}`)}\n`,
          );
      },
    });
    const failed = ordered.filter((r) => r.required && r.conclusion !== 'success').map((r) => r.gate_id);
    let sealed: GateRunRecord | null = null;
    if (values.record)
      sealed = await record(values.tenant!, {
        workspace: workspaceName,
        source: set.source,
        required: set.gates.filter((g) => g.required).map((g) => g.id),
        subject: subjectOf(ctx),
        results: ordered,
        artifacts,
      });
    if (values.json) {
      out(
        `${JSON.stringify({ workspace: workspaceName, source: set.source, subject: subjectOf(ctx), ready: failed.length === 0, results: ordered, gate_run_id: sealed?.id ?? null, ledger: sealed?.ledger ?? null }, null, 2)}\n`,
      );
    } else {
      out(failed.length ? `not ready: ${visible(failed.join(', '))} did not pass\n` : 'ready: every required gate passed\n');
      if (sealed?.ledger)
        out(`recorded as ${sealed.id}: ledger entries ${sealed.ledger.from_seq}..${sealed.ledger.to_seq}, head ${sealed.ledger.head_hash.slice(0, 16)}\n`);
    }
    return failed.length ? 1 : 0;
  } finally {
    process.off('SIGINT', stop);
    sandbox.close();
  }
}

/**
 * Refuses to record anywhere but the service's own ledger. Run outside the service's folder (or with another
 * SERVICE_DATA_DIR), --record made a new store there and a new evidence key, and sealed the results into a
 * ledger the service never reads, signed by a key no one pins: "recorded" and exit 0.
 */
async function requireServiceLedger(tenantId: string): Promise<EvidenceSigner> {
  const config = loadConfig();
  const file = path.join(config.dataDir, 'service.sqlite');
  if (!config.mongodbUri && !existsSync(file))
    throw new UsageError(`--record: no store at ${file}: set SERVICE_DATA_DIR to the service's data folder (or MONGODB_URI to its MongoDB)`);
  const signer = serviceSigner();
  // the key that signed the tenant's ledger last must be this one or one it took over from: a key of before a
  // rotation, or of another folder, signed entries that broke every pack of the commit for good ("recorded", exit 0)
  const store = await openStore({ mongodbUri: config.mongodbUri, dataDir: config.dataDir });
  try {
    assertSignsAfter(await store.evidence.head(tenantId), signer);
  } catch (err) {
    throw err instanceof ConflictError ? new UsageError(`--record: ${err.message}`) : err;
  } finally {
    await store.close();
  }
  return signer;
}

/** The service's evidence signer, as it loads it: SERVICE_EVIDENCE_KEY (or its key file) and SERVICE_EVIDENCE_PREVIOUS_KEYS. */
function serviceSigner(): EvidenceSigner {
  const config = loadConfig();
  // loadKeyBytes would make a key of its own (its source 'generated'): a ledger signed by it is not the service's
  if (!config.evidenceKey && !existsSync(path.join(config.dataDir, EVIDENCE_KEY_FILE)))
    throw new UsageError(
      `--record: no evidence key: set SERVICE_EVIDENCE_KEY to the service's, or SERVICE_DATA_DIR to the folder of its ${EVIDENCE_KEY_FILE} (not in ${config.dataDir})`,
    );
  const key = loadKeyBytes({
    value: config.evidenceKey,
    variable: 'SERVICE_EVIDENCE_KEY',
    file: EVIDENCE_KEY_FILE,
    dataDir: config.dataDir,
    isProduction: config.isProduction,
  });
  if (key.source === 'generated') throw new UsageError(`--record: no evidence key: set SERVICE_EVIDENCE_KEY to the service's`);
  return signerOf(
    key.key,
    config.evidencePreviousKeys.map((text) => publicKeyFromText(text)!),
  );
}

/** Writes results to the service's store and ledger, as a gate run the CLI made. */
async function record(
  tenantId: string,
  run: { workspace: string; source: string; required: string[]; subject: GateRunRecord['subject']; results: GateResult[]; artifacts: ArtifactPayload[] },
): Promise<GateRunRecord | null> {
  const config = loadConfig();
  // checked again (the store or the key file gone while the gates ran), and before the store is opened, which would
  // make it; the ledger's head is checked again by the append itself, in its write
  const signer = await requireServiceLedger(tenantId);
  const store = await openStore({ mongodbUri: config.mongodbUri, dataDir: config.dataDir });
  try {
    const ledger = ledgerOf({ store, clock: systemClock, signer });
    const gateRun: GateRunRecord = {
      id: newId('grn'),
      tenant_id: tenantId,
      workspace: run.workspace,
      status: 'running',
      source: run.source,
      gates: run.results.map((r) => r.gate_id),
      required_gates: run.required,
      trigger: { type: 'cli' },
      subject: run.subject,
      results: [],
      ledger: null,
      created_at: new Date().toISOString(),
      finished_at: null,
    };
    await store.gateRuns.insert(gateRun);
    for (const r of run.results) await store.gateRuns.putResult(tenantId, gateRun.id, r);
    if (run.artifacts.length) await store.evidence.append(tenantId, () => [], run.artifacts);
    return await sealGateRun({ store, clock: systemClock, ledger }, gateRun);
  } finally {
    await store.close();
  }
}

/** Checks an evidence pack offline; the exit code is 1 when anything in it does not hold. */
export async function gatesVerify(file: string, values: { key?: string; tenant?: string; json?: boolean }, out: (text: string) => void): Promise<number> {
  const data = await fs.readFile(file).catch(() => {
    throw new UsageError(`cannot read ${file}`);
  });
  // the key pinned: the service's public key (every bit of it), or its id (the first 64 bits of its digest)
  let pin: { keyId?: string; publicKey?: KeyObject } = {};
  let pinnedBy: 'key id' | 'public key' | undefined;
  if (values.key !== undefined && /^[0-9a-f]{16}$/.test(values.key)) [pin, pinnedBy] = [{ keyId: values.key }, 'key id'];
  else if (values.key !== undefined) {
    const publicKey = publicKeyFromText(values.key);
    if (!publicKey)
      throw new UsageError("--key is the service's key id (16 hex characters) or its Ed25519 public key (the base64 line of a pack's public-key.pem)");
    [pin, pinnedBy] = [{ publicKey }, 'public key'];
  }
  let verdict;
  try {
    verdict = verifyPack(await readPack(data), { ...pin, tenantId: values.tenant });
  } catch (err) {
    // (JSON.parse's message quotes the file's bytes: shown as escapes below)
    verdict = { ok: false as const, problem: { part: 'envelope' as const, message: `not an evidence pack: ${(err as Error).message}` } };
  }
  if (values.json) {
    out(
      `${JSON.stringify(verdict.ok ? { ok: true, pinned: Boolean(values.key), ...(pinnedBy ? { pinned_by: pinnedBy } : {}), key_id: verdict.key_id, entries: verdict.entries, earlier_keys: verdict.earlier_keys, statement: verdict.statement } : verdict, null, 2)}\n`,
    );
    return verdict.ok ? (values.key ? 0 : 3) : 1;
  }
  // every text below but our own is the pack's, which anyone may have written: shown, never obeyed by the terminal
  const line = (text: string) => out(`${visible(text)}\n`);
  if (!verdict.ok) {
    line(`FAILED (${verdict.problem.part}${verdict.problem.seq === undefined ? '' : `, entry ${verdict.problem.seq}`}): ${verdict.problem.message}`);
    return 1;
  }
  const p = verdict.statement.predicate;
  const subject = verdict.statement.subject[0];
  if (!values.key) {
    // a pack checked against the key it carries proves only that someone signed it
    out(
      `UNPINNED: the pack holds together, signed by key ${verdict.key_id}, the key it carries itself; pass --key <the service's public key> (or its key id) to check it is the service's\n`,
    );
    return 3;
  }
  line(`ok: signed by key ${verdict.key_id} (pinned by its ${pinnedBy})`);
  line(`tenant: ${typeof p.tenant_id === 'string' ? p.tenant_id : '(not named: a pack made before tenants were signed)'}`);
  const missing = Array.isArray(p.missing) ? (p.missing as string[]) : [];
  line(`ready: ${p.ready === true ? 'yes' : 'no'}${missing.length ? ` (no result for required gates: ${missing.join(', ')})` : ''}`);
  line(
    `subject: ${subject?.name ?? '-'} ${Object.entries(subject?.digest ?? {})
      .map(([k, v]) => `${k}:${String(v).slice(0, 12)}`)
      .join(' ')}`,
  );
  if (p.ledger && verdict.entries) {
    line(`ledger: ${verdict.entries} entries verified (${p.ledger.from_seq}..${p.ledger.to_seq}), head ${String(p.ledger.head_hash).slice(0, 16)}`);
    if (verdict.earlier_keys.length)
      line(`  some signed by the ledger's earlier key ${verdict.earlier_keys.join(', ')}, which key ${verdict.key_id} vouches for (the key was rotated)`);
  } else line('ledger: not in this file (the envelope alone was checked; get the pack with format=tar to check its ledger)');
  for (const g of p.gates) line(`  ${g.gate_id}: ${(g as { conclusion?: string }).conclusion ?? '?'} (entry ${g.ledger_seq})`);
  return 0;
}
