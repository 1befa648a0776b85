// Runs one gate: its command in the sandbox, in the workspace, as untrusted code (or the built-in
// secret scan), with its timeout; then what decides it (exit code 0, or its report), its
// annotations, the subject and digests it is about, tool versions and the artifacts it keeps. The
// service's gate runs and the CLI's `gates run` both call this.
import fs from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import { glob } from 'tinyglobby';
import { canonicalJson, payloadDigest, sha256Hex } from '../evidence/index.js';
import type { Annotation, GateConclusion, GateResult, GateSubject, VibeGates } from '../platform/index.js';
import { runProcess, type Sandbox } from '../tools/index.js';
import { GATE_FILES, loadGateSet, readPlainFile, type GateDefinition } from './definition.js';
import { keptAnnotations, readReport, type Report } from './reports.js';
import { maskSecrets, scanSecrets, scanSummary } from './secret-scan.js';
import { entryOf, readInside, staysInside } from './paths.js';
import { committedDigest, FileHasher, gitState, inputFiles, type GitState } from './subject.js';

const OUTPUT_TAIL_BYTES = 8 * 1024;
/** What is masked with the tail, before it: a key the tail's cut would halve is seen whole. */
const MASK_CONTEXT_BYTES = 16 * 1024;
/** From the start up to the first private key's end: with no BEGIN line in it, the body of a key an earlier cut halved. */
const KEY_CUT_AT_START = /^[\s\S]*?-----END [A-Z0-9 ]*PRIVATE KEY-----/;

/**
 * The last OUTPUT_TAIL_BYTES of what a gate printed, its secrets masked. Masked before it is cut, with
 * the context before the cut (a key cut in two lost its BEGIN line and was no longer seen as one, so
 * its body stayed in the tail), and a key body at the start that an earlier cut left without its BEGIN
 * line (the output keeps only its own tail) masked too.
 */
/**
 * A report's annotations with the secrets of every field masked (a test's name, a file's path, a message
 * may all carry a token), in one scan: the fields joined by a line no secret's pattern spans, then split
 * (each field alone, should a match have spanned it after all).
 */
async function maskedAnnotations(annotations: Annotation[]): Promise<Annotation[]> {
  const SEPARATOR = '\n\u2063\u2063\n';
  const fields = annotations.flatMap((a) => [a.message, a.title ?? '', a.path ?? '']);
  const joined = (await maskSecrets(fields.join(SEPARATOR))).split(SEPARATOR);
  const masked = joined.length === fields.length ? joined : await Promise.all(fields.map(maskSecrets));
  return annotations.map((a, i) => ({
    ...a,
    message: masked[3 * i]!,
    ...(a.title === undefined ? {} : { title: masked[3 * i + 1]! }),
    path: a.path === null ? null : masked[3 * i + 2]!,
  }));
}

/** The most of a result's summary kept (a report's own, a bail-out's reason): what a line in a list can show. */
const SUMMARY_MAX_CHARS = 1000;

/** A result's summary with its secrets masked, cut to SUMMARY_MAX_CHARS (masked before the cut, with the context a key needs). */
async function maskedSummary(summary: string): Promise<string> {
  const masked = await maskSecrets(
    summary.length > SUMMARY_MAX_CHARS + MASK_CONTEXT_BYTES ? summary.slice(0, SUMMARY_MAX_CHARS + MASK_CONTEXT_BYTES) : summary,
  );
  return masked.length > SUMMARY_MAX_CHARS ? `${masked.slice(0, SUMMARY_MAX_CHARS - 1)}…` : masked;
}

export async function maskedTail(output: string): Promise<string> {
  const windowed = output.length > OUTPUT_TAIL_BYTES + MASK_CONTEXT_BYTES ? output.slice(-(OUTPUT_TAIL_BYTES + MASK_CONTEXT_BYTES)) : output;
  const masked = await maskSecrets(windowed.replace(KEY_CUT_AT_START, (head) => (head.includes('-----BEGIN') ? head : '***')));
  return masked.length > OUTPUT_TAIL_BYTES ? masked.slice(-OUTPUT_TAIL_BYTES) : masked;
}
const REPORT_MAX_BYTES = 8 * 1024 * 1024;
const ARTIFACT_MAX_BYTES = 1024 * 1024;
const ARTIFACTS_MAX_BYTES = 5 * 1024 * 1024;
/**
 * The most files a gate keeps: each is a ledger payload, a row of its result (in the gate run, the ledger
 * and every pack of it), and the byte cap alone let 5 million one-byte files through.
 */
const ARTIFACTS_MAX_FILES = 100;

export type GateContext = {
  sandbox: Sandbox;
  /** the workspace folder, absolute and resolved */
  workspace: string;
  /** the workspace as its tenant names it (relative to its root) */
  workspaceName: string;
  git: GitState;
  hasher: FileHasher;
  /**
   * the digest of the commit's files when the gate run began (committedDigest), null when the tree was not clean
   * then; absent or null, the gate's own start is taken (runGateSet takes the set's)
   */
  committedDigest?: string | null;
  /** the environment every gate starts from (a short allowlist) */
  baseEnv: Record<string, string>;
  /** the value of a name a gate asks for, or undefined when it is not given to gates */
  envValue(name: string): string | undefined;
  network: boolean;
  /** folders besides the workspace the sandbox mounts read-only (the objects a vibe run's scratch clone shares) */
  readOnlyBinds?: string[];
  signal?: AbortSignal;
  /** the output of the gate's command as it comes */
  onOutput?(stream: 'stdout' | 'stderr', text: string): void;
};

/** An artifact's content, to keep as a ledger payload beside the result. */
export type ArtifactPayload = { digest: string; body: string };

/** each sandbox's answer (the CLI's and the service's see different tools) */
const versions = new WeakMap<Sandbox, Promise<Record<string, string>>>();
/**
 * node, npm and git as the sandbox sees them, asked once per sandbox while the answer is whole. Asked in an empty
 * folder of the service's own, not a tenant's workspace: its answer serves every tenant's results, and a
 * workspace's `.npmrc` (or a FIFO by that name) would have chosen it, or stalled it. An answer that failed or
 * is partial is not kept (a probe that failed once, kept, failed every later gate of the process).
 */
function toolVersions(sandbox: Sandbox): Promise<Record<string, string>> {
  const known = versions.get(sandbox);
  if (known) return known;
  const asked = (async () => {
    const empty = await fs.mkdtemp(path.join(os.tmpdir(), 'svc-tool-versions-'));
    try {
      const r = await runProcess(sandbox, ['/bin/sh', '-c', 'node --version; npm --version; git --version'], {
        workspace: await fs.realpath(empty),
        env: { PATH: '/usr/local/bin:/usr/bin:/bin', HOME: '/tmp' },
        network: false,
        maxBytes: 4096,
        timeoutMs: 20_000,
      });
      const [node, npm, git] = r.stdout.split('\n');
      const found = Object.fromEntries(
        Object.entries({ node: node?.trim(), npm: npm?.trim(), git: git?.replace('git version', '').trim() }).filter(([, v]) => v),
      ) as Record<string, string>;
      if (r.exit_code !== 0 || Object.keys(found).length < 3) versions.delete(sandbox);
      return found;
    } catch {
      versions.delete(sandbox);
      return {};
    } finally {
      await fs.rm(empty, { recursive: true, force: true }).catch(() => undefined);
    }
  })();
  versions.set(sandbox, asked);
  return asked;
}

/**
 * What a gate may have of an environment: the names it asks for, from `source`, except the service's
 * own configuration and anything that looks like a credential of it. The service and the CLI both
 * pass a gate's names through this, so a gate set cannot make either hand over the service's secrets.
 */
export function gateEnv(source: (name: string) => string | undefined): (name: string) => string | undefined {
  const refused = /^(SERVICE_|REDIS_|MONGODB_|NODE_OPTIONS$|LD_)/;
  return (name) => (refused.test(name) ? undefined : source(name));
}

export const subjectOf = (ctx: Pick<GateContext, 'workspaceName' | 'git'>): GateSubject => ({
  workspace: ctx.workspaceName,
  commit: ctx.git.commit,
  tree: ctx.git.tree,
  dirty: ctx.git.dirty,
});

/** The digest of a gate's inputs now: what a result is compared with to know whether it is stale. */
export async function inputDigest(ctx: Pick<GateContext, 'workspace' | 'git' | 'hasher'>, gate: GateDefinition): Promise<string> {
  return ctx.hasher.digest(ctx.workspace, await inputFiles(ctx.workspace, gate.inputs, ctx.git));
}

/** The shortest value a gate is given by name that is masked in what it prints (a shorter one, `1` or `true`, is no secret). */
const GIVEN_MASKED_MIN_CHARS = 6;

/**
 * Runs a gate. `after` is the repository as the gate left it (null outside one): its result is of a clean
 * commit only if the tree was clean when it began and its tracked files still are the commit's when it ends.
 */
export async function runGate(
  gate: GateDefinition & { digest: string },
  ctx: GateContext,
): Promise<{ result: GateResult; artifacts: ArtifactPayload[]; after: GitState | null }> {
  const started = new Date();
  const files = await inputFiles(ctx.workspace, gate.inputs, ctx.git);
  // the commit's files as the service read them when the gate run began (a gate alone, or of a gate run whose
  // tree was not clean then: as this gate finds them); git's status can be made to lie
  const clean = ctx.git.dirty === false;
  const [digest, tools, began] = await Promise.all([
    ctx.hasher.digest(ctx.workspace, files),
    toolVersions(ctx.sandbox),
    clean ? (ctx.committedDigest ?? committedDigest(ctx.hasher, ctx.workspace, ctx.git)) : null,
  ]);
  let conclusion: GateConclusion;
  let summary: string;
  let exitCode: number | null = null;
  let tail = '';
  let report: Report | null = null;
  if (gate.builtin === 'secret-scan') {
    const found = await scanSecrets(ctx.workspace, files, { signal: ctx.signal, deadline: started.getTime() + gate.timeout_seconds * 1000 });
    // a file it could not scan is not one without secrets: the scan does not pass, and names it
    report = { ok: !found.failed && !found.unscanned.length && !found.stopped, annotations: found.annotations, summary: '' };
    conclusion =
      ctx.signal?.aborted || found.stopped === 'cancelled' ? 'cancelled' : found.stopped === 'timed_out' ? 'timed_out' : report.ok ? 'success' : 'failure';
    summary =
      found.stopped === 'cancelled'
        ? 'stopped before it ended'
        : found.stopped === 'timed_out'
          ? `did not end within ${gate.timeout_seconds} s (${found.scanned} of ${files.length} files scanned)`
          : scanSummary(found);
  } else {
    const env: Record<string, string> = { ...ctx.baseEnv, CI: 'true' };
    const given: [string, string][] = [];
    for (const name of gate.env) {
      const value = ctx.envValue(name);
      if (value === undefined) continue;
      env[name] = value;
      if (value.length >= GIVEN_MASKED_MIN_CHARS) given.push([name, value]);
    }
    // the values the gate was given by name (a deploy key, a token the secret patterns do not know) are its caller's
    // secrets: never kept in what it printed or reported (results, the ledger, every pack), longest first
    given.sort((a, b) => b[1].length - a[1].length);
    const unsaid = (text: string) => given.reduce((t, [name, value]) => t.split(value).join(`[${name}]`), text);
    const r = await runProcess(ctx.sandbox, gate.run!, {
      workspace: ctx.workspace,
      env,
      network: ctx.network,
      readOnlyBinds: ctx.readOnlyBinds,
      signal: ctx.signal,
      timeoutMs: gate.timeout_seconds * 1000,
      maxBytes: gate.report && !gate.report.path ? REPORT_MAX_BYTES : 64 * 1024,
      onOutput: ctx.onOutput,
    });
    exitCode = r.exit_code;
    const combined = unsaid(`${r.stdout}${r.stderr ? `\n${r.stderr}` : ''}`);
    // what a gate printed is kept (results, ledger, packs): the secrets in it are not
    tail = await maskedTail(combined);
    const text = gate.report ? unsaid(await reportText(ctx.workspace, gate.report.path, r.stdout, started)) : '';
    // tsc says nothing when it finds nothing; other tools always write a report
    if (gate.report)
      report =
        text.trim() || (gate.report.format === 'tsc' && r.exit_code === 0)
          ? await readReport(gate.report.format, text, ctx.workspace)
          : { ok: false, annotations: [], summary: `no ${gate.report.format} report${gate.report.path ? ` in ${gate.report.path}` : ''}` };
    if (r.aborted) {
      conclusion = 'cancelled';
      summary = 'stopped before it ended';
    } else if (r.timed_out) {
      conclusion = 'timed_out';
      summary = `did not end within ${gate.timeout_seconds} s`;
    } else {
      // with `pass: report` the report must pass and the command exit 0: a runner that fails after writing a
      // good report (ESLint's fatal exit 2 with `[]`, a crash, a coverage threshold) has not passed
      const passed = r.exit_code === 0 && (gate.pass !== 'report' || Boolean(report?.ok));
      conclusion = passed ? 'success' : 'failure';
      const ended = r.exit_code === 0 ? 'exited 0' : `exited ${r.exit_code ?? r.signal}`;
      // a process the kernel ended for the step's memory is said first: the exit alone reads as the tool's own failure
      const memory = r.out_of_memory ? `ran out of memory (over the step's ${ctx.sandbox.limits?.memoryMb} MB, SERVICE_SANDBOX_MEMORY_MB); ` : '';
      const cpu = r.cpu_exceeded ? `a process used its ${ctx.sandbox.limits?.cpuSeconds} s of CPU time (SERVICE_SANDBOX_CPU_SECONDS); ` : '';
      summary = `${memory}${cpu}${report?.summary || ended}`;
    }
  }
  // the tree may have changed while the gate ran (the gate itself, another gate beside it, anyone with the
  // folder): what it read was then not the commit, whatever the tree was when it began
  const after = ctx.git.commit ? await gitState(ctx.sandbox, ctx.workspace, ctx.readOnlyBinds ?? [], { tracked: true }) : null;
  const subject = subjectOf(ctx);
  // and its files are compared with the service's own reading of them when the gate run began: an edit hidden from
  // git (an index or a filter this gate, or one before it, wrote) is a change all the same
  const unchanged = async (now: GitState) =>
    now.commit === subject.commit && now.dirty === false && (await committedDigest(ctx.hasher, ctx.workspace, now)) === began;
  if (clean && after && !(await unchanged(after))) subject.dirty = true;
  const kept = await keepArtifacts(ctx.workspace, gate.artifacts);
  const finished = new Date();
  return {
    result: {
      gate_id: gate.id,
      name: gate.name,
      required: gate.required,
      conclusion,
      // the gate's own words (a report's summary, a TAP bail-out's reason, a file's name) may carry a token, and a
      // report's may run to megabytes: kept in the result, the ledger, every pack and event, masked and short
      summary: await maskedSummary(summary),

      exit_code: exitCode,
      duration_ms: finished.getTime() - started.getTime(),
      output_tail: tail,
      // every kind of report within the same bounds (the secret scan's too)
      annotations: await maskedAnnotations(keptAnnotations(report?.annotations ?? [])),
      subject,
      input_digest: digest,
      definition_digest: gate.digest,
      tool_versions: tools,
      artifacts: kept.map((a) => a.meta),
      started_at: started.toISOString(),
      finished_at: finished.toISOString(),
    },
    artifacts: kept.map((a) => a.payload),
    after,
  };
}

/** Runs gates side by side, at most `concurrency` at once; results in the gates' order. */
export async function runGateSet(
  gates: (GateDefinition & { digest: string })[],
  ctx: GateContext,
  opts: { concurrency: number; onResult?: (r: GateResult) => void },
): Promise<{ results: GateResult[]; artifacts: ArtifactPayload[] }> {
  const results = new Map<string, GateResult>();
  const artifacts: ArtifactPayload[] = [];
  const queue = [...gates];
  // every gate's files compared with the set's start, not its own: a gate's hidden edit is seen by those after it
  if (ctx.committedDigest === undefined && ctx.git.dirty === false)
    ctx = { ...ctx, committedDigest: await committedDigest(ctx.hasher, ctx.workspace, ctx.git) };
  const worker = async () => {
    for (let g = queue.shift(); g; g = queue.shift()) {
      const ran = await runGate(g, ctx);
      results.set(g.id, ran.result);
      artifacts.push(...ran.artifacts);
      opts.onResult?.(ran.result);
    }
  };
  await Promise.all(Array.from({ length: Math.max(1, Math.min(opts.concurrency, gates.length)) }, worker));
  return { results: gates.map((g) => results.get(g.id)!), artifacts };
}

/**
 * What says how a package manager runs scripts (npm's script-shell=/bin/true ran none of them, and every gate
 * that runs one passed): the workspace's own is put in a copy before its gates run, as its gate file is.
 */
const RUNNER_CONFIG_FILES = ['.npmrc', '.yarnrc', '.yarnrc.yml'] as const;

/**
 * Puts the workspace's own gate definitions into a copy before its gates run: its gate file (or none), how its
 * package manager runs scripts (RUNNER_CONFIG_FILES, or none), and its package.json scripts (the detected gates
 * and many gate commands run them), the rest of the copy's package.json kept. What the copy holds at those names is removed first, never written through
 * (a link the run left there could point anywhere).
 */
async function restoreGateDefinitions(workspace: string, copy: string): Promise<void> {
  // read through one handle that follows no link (readPlainFile): a check by name, then a read by name,
  // would let the run swap in a link between the two and have any file the service can read copied here
  const readPlain = async (root: string, name: string) => {
    const file = await readPlainFile(root, name);
    return typeof file === 'object' ? file.text : null;
  };
  const replace = async (name: string, text: string | null) => {
    await fs.rm(path.join(copy, name), { force: true, recursive: true });
    if (text !== null) await fs.writeFile(path.join(copy, name), text, { flag: 'wx' });
  };
  for (const name of [...GATE_FILES, ...RUNNER_CONFIG_FILES]) await replace(name, await readPlain(workspace, name));
  const original = await readPlain(workspace, 'package.json');
  if (original === null) return;
  const objectOf = (text: string | null): Record<string, unknown> | null => {
    try {
      const v: unknown = text === null ? null : JSON.parse(text);
      return v && typeof v === 'object' && !Array.isArray(v) ? (v as Record<string, unknown>) : null;
    } catch {
      return null;
    }
  };
  const edited = objectOf(await readPlain(copy, 'package.json'));
  const scripts = objectOf(original)?.scripts;
  if (!edited) return replace('package.json', original);
  if (scripts === undefined) delete edited.scripts;
  else edited.scripts = scripts;
  await replace('package.json', `${JSON.stringify(edited, null, 2)}\n`);
}

/**
 * A workspace's gate set run in-process on a folder that is not one of the tenant's workspaces (a vibe
 * run's edited copy): its results, for the run's own result.
 */
export async function gatesOnCopy(
  deps: { sandbox: Sandbox; childEnv: Record<string, string>; concurrency: number },
  copy: { dir: string; setFrom: string; workspaceName: string; network: boolean; readOnlyBinds: string[]; signal: AbortSignal },
): Promise<VibeGates> {
  // the service reads the copy's files itself: every check is against its real path
  const dir = await fs.realpath(copy.dir);
  // the gates are the workspace's own (`setFrom`), not the copy's: a run that edits its gate file or the
  // scripts its gates run does not choose what checks its work
  const from = await fs.realpath(copy.setFrom);
  const set = await loadGateSet(from);
  await restoreGateDefinitions(from, dir);
  const ctx: GateContext = {
    sandbox: deps.sandbox,
    workspace: dir,
    workspaceName: copy.workspaceName,
    git: await gitState(deps.sandbox, dir, copy.readOnlyBinds),
    hasher: new FileHasher(),
    baseEnv: deps.childEnv,
    envValue: gateEnv((name) => deps.childEnv[name]),
    network: copy.network,
    readOnlyBinds: copy.readOnlyBinds,
    signal: copy.signal,
  };
  const { results } = await runGateSet(set.gates, ctx, { concurrency: deps.concurrency });
  return {
    ready: results.every((r) => !r.required || r.conclusion === 'success'),
    source: set.source,
    results: results.map((r) => ({ gate_id: r.gate_id, required: r.required, conclusion: r.conclusion, summary: r.summary, annotations: r.annotations })),
  };
}

/** A report file the command wrote (a plain file inside the workspace), or its standard output. */
/** The report: the command's output, or the file it names, only if the command wrote it (a file from an earlier run says nothing of this one). */
async function reportText(workspace: string, file: string | undefined, stdout: string, since: Date): Promise<string> {
  if (!file) return stdout;
  const entry = await entryOf(workspace, file);
  // file times have whole-millisecond or coarser clocks on some file systems: a moment of slack
  if (entry?.kind !== 'file' || entry.mtimeMs < since.getTime() - 1000) return '';
  return (await readInside(workspace, file, REPORT_MAX_BYTES))?.toString('utf8') ?? '';
}

async function keepArtifacts(workspace: string, globs: string[]) {
  if (!globs.length) return [];
  const files = (await glob(globs.filter(staysInside), { cwd: workspace, dot: true, onlyFiles: true, followSymbolicLinks: false, ignore: ['.git/**'] }))
    .filter(staysInside)
    .sort();
  const kept: { meta: GateResult['artifacts'][number]; payload: ArtifactPayload }[] = [];
  let total = 0;
  for (const rel of files) {
    if (kept.length >= ARTIFACTS_MAX_FILES) break;
    const content = await readInside(workspace, rel, ARTIFACT_MAX_BYTES);
    if (!content || total + content.length > ARTIFACTS_MAX_BYTES) continue;
    total += content.length;
    const body = canonicalJson({ path: rel, size: content.length, content_base64: content.toString('base64') });
    const digest = payloadDigest(body);
    kept.push({ meta: { path: rel, size: content.length, sha256: sha256Hex(content), payload_digest: digest }, payload: { digest, body } });
  }
  return kept;
}
