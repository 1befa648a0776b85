// The process of one audit phase, started by the service in the sandbox with the workspace as its
// working folder (read-only): `node phase-main.js <phase> <options as JSON>`. It
// prints one JSON line (PhaseOutput) and exits 0, or prints why it failed on stderr and exits 1.
import fs from 'node:fs';
import type { AuditOptions, AuditPhase } from '../../platform/index.js';
import { boundedMetrics, cutText, DEPENDENCIES_MAX, MESSAGE_MAX_BYTES, NAME_MAX_BYTES, TEXT_MAX_BYTES } from './bounds.js';
import { masked } from './mask.js';
import { Findings, FINDINGS_CAP, openWorkspace, type PhaseOutput, type Workspace } from './workspace.js';

type Options = Pick<AuditOptions, 'layers'> & {
  identity: string | null;
  repositoryAbove: string | null;
  repository: { root: string; dir: string } | null;
};

/**
 * Each phase's code, loaded only by the process that runs it: the architecture phase's TypeScript and
 * dependency-cruiser took 0.65 s of every phase process's start (a process loading all four: 1.05 s; the
 * security phase's alone: 0.3 s), and an audit starts four.
 */
const PHASES: Record<AuditPhase, (ws: Workspace, findings: Findings, options: Options) => Promise<Pick<PhaseOutput, 'metrics' | 'dependencies'>>> = {
  security: async (ws, findings) => ({ metrics: await (await import('./security.js')).securityPhase(ws, findings) }),
  architecture: async (ws, findings, options) => ({ metrics: await (await import('./architecture.js')).architecturePhase(ws, findings, options.layers) }),
  sanity: async (ws, findings) => ({ metrics: await (await import('./sanity.js')).sanityPhase(ws, findings) }),
  health: async (ws, findings) => (await import('./health.js')).healthPhase(ws, findings),
};

async function main(phase: AuditPhase, options: Options): Promise<PhaseOutput> {
  // the folder mounted here is the one the service checked (device and inode), not one swapped in since
  const here = fs.statSync('.');
  if (options.identity && `${here.dev}:${here.ino}` !== options.identity) throw new Error('the workspace is not the folder that was checked');
  const run = Object.hasOwn(PHASES, phase) ? PHASES[phase] : null;
  if (!run) throw new Error(`no phase ${String(phase)}`);
  const ws = await openWorkspace(process.cwd(), { repositoryAbove: options.repositoryAbove, repository: options.repository });
  const findings = new Findings(FINDINGS_CAP);
  const { metrics, dependencies } = await run(ws, findings, options);
  if (ws.truncated) metrics.files_truncated_at = ws.files.length;
  if (ws.untrackedNodeModules) metrics.node_modules_untracked_skipped = ws.untrackedNodeModules;
  const { findings: listed, omitted } = findings.result();
  // masked whole, then cut (bounds.ts): a secret cut in two would not be masked
  return {
    findings: await Promise.all(
      listed.map(async (f) => ({
        ...f,
        file: f.file === null ? null : cutText(await quoted(f.file), TEXT_MAX_BYTES),
        message: cutText(await quoted(f.message), MESSAGE_MAX_BYTES),
      })),
    ),
    findings_omitted: omitted,
    counts: findings.counts,
    metrics: boundedMetrics(await maskedValue(metrics)) as PhaseOutput['metrics'],
    // data for the service's registry lookup, not quoted in the report (the lookup's findings name a package and a
    // version); bounded too, as it goes out with the rest: a name cut is no npm name, and is not looked up
    ...(dependencies
      ? {
          dependencies: dependencies.slice(0, DEPENDENCIES_MAX).map((d) => ({
            name: cutText(d.name, NAME_MAX_BYTES),
            range: cutText(d.range, TEXT_MAX_BYTES),
            locked: typeof d.locked === 'string' ? cutText(d.locked, NAME_MAX_BYTES) : null,
          })),
        }
      : {}),
  };
}

/**
 * What the report quotes of the workspace leaves here masked, whatever the phase: a finding's file and
 * message, and every text of the metrics (a branch's name, a license the lockfile declares, a path), keys
 * included. A phase may mask what it quotes itself (the mask then takes only the quote); masking twice
 * changes nothing. Each distinct text is linted once.
 */
const seen = new Map<string, Promise<string>>();
function quoted(text: string): Promise<string> {
  let out = seen.get(text);
  if (!out) seen.set(text, (out = masked(text)));
  return out;
}

async function maskedValue(value: unknown): Promise<unknown> {
  if (typeof value === 'string') return quoted(value);
  if (Array.isArray(value)) return Promise.all(value.map(maskedValue));
  if (value && typeof value === 'object')
    return Object.fromEntries(await Promise.all(Object.entries(value).map(async ([k, v]) => [await quoted(k), await maskedValue(v)])));
  return value;
}

const phase = process.argv[2] as AuditPhase;
const options = JSON.parse(process.argv[3] ?? '{}') as Partial<Options>;
main(phase, {
  layers: options.layers ?? null,
  identity: options.identity ?? null,
  repositoryAbove: options.repositoryAbove ?? null,
  repository: options.repository ?? null,
}).then(
  (out) => process.stdout.write(`${JSON.stringify(out)}\n`),
  async (err: unknown) => {
    // an error may quote the workspace (a parser's message): what it says goes to the service's log masked
    process.stderr.write(`${await quoted((err as Error)?.stack ?? String(err)).catch(() => 'the phase failed')}\n`);
    process.exitCode = 1;
  },
);
