// Starts one phase's process (phases/phase-main) in the sandbox: the workspace read-only, the
// service's code and its node_modules read-only at their own paths, no network, the phase's timeout.
import fs from 'node:fs';
import { createRequire } from 'node:module';
import path from 'node:path';
import { fileURLToPath, pathToFileURL } from 'node:url';
import { buildIsCurrent, PROJECT_ROOT } from '../../config/paths.js';
import type { AuditLayer, AuditPhase } from '../platform/index.js';
import { runProcess, type Sandbox } from '../tools/index.js';
import { gitMountsOf } from './git-mounts.js';
import { PHASE_OUTPUT_MAX_BYTES } from './phases/bounds.js';
import type { PhaseOutput } from './phases/workspace.js';

const here = fileURLToPath(import.meta.url);

export class PhaseError extends Error {
  constructor(
    readonly status: 'failed' | 'timed_out',
    message: string,
  ) {
    super(message);
  }
}

/**
 * The sandbox limits a phase's address space (not only what it uses): WebAssembly's guard regions
 * reserve more than the limit (tsx and some parsers load wasm), so wasm goes without its trap handler
 * (bounds checks instead); and glibc's malloc arenas, up to 8 per core of 64 MB each, are capped so
 * that a many-core machine does not spend the limit on reservations (V8 then fails "out of memory").
 */
const NODE = [process.execPath, '--disable-wasm-trap-handler'];
const ENV = { PATH: '/usr/local/bin:/usr/bin:/bin', HOME: '/tmp', MALLOC_ARENA_MAX: '2' };

type Command = { argv: string[]; env: Record<string, string>; binds: string[] };
let chosen: Command | undefined;

/**
 * How a phase process starts, chosen once a process. Built, this file's own `.js`; under tsx (development and
 * tests) the build's when dist/ is current, which starts without compiling the sources (a phase process took
 * about 0.7 s more CPU under tsx, each audit four of them), else the `.ts` under tsx.
 */
function command(): Command {
  if (chosen) return chosen;
  const own = (ext: string) => path.join(path.dirname(here), 'phases', `phase-main${ext}`);
  const tsx = path.extname(here) === '.ts' && !buildIsCurrent();
  const entry = path.extname(here) !== '.ts' ? own('.js') : tsx ? own('.ts') : path.join(PROJECT_ROOT, 'dist', 'engine', 'audit', 'phases', 'phase-main.js');
  /** the folder holding `engine/` (the checkout, or its dist/) and the package root above it */
  const codeRoot = path.dirname(path.dirname(path.dirname(path.dirname(entry))));
  const packageRoot = fs.existsSync(path.join(codeRoot, 'package.json')) ? codeRoot : path.dirname(codeRoot);
  // config/: the security phase scans with the gates' code (engine/gates), which reads its paths from there
  const binds = [path.join(codeRoot, 'engine'), path.join(codeRoot, 'config'), path.join(packageRoot, 'node_modules'), path.join(packageRoot, 'package.json')];
  if (!tsx) return (chosen = { argv: [...NODE, entry], env: {}, binds });
  // under tsx: its loader by its own path (the workspace has none), with the service's tsconfig, not the workspace's
  const tsconfig = path.join(packageRoot, 'tsconfig.json');
  return (chosen = {
    argv: [...NODE, '--import', pathToFileURL(createRequire(import.meta.url).resolve('tsx')).href, entry],
    env: { TSX_TSCONFIG_PATH: tsconfig },
    binds: [...binds, tsconfig],
  });
}

export async function runPhase(
  sandbox: Sandbox,
  root: string,
  phase: AuditPhase,
  opts: {
    layers: AuditLayer[] | null;
    identity?: string;
    /** the tenant's root (a real path): git data of the folder's repository inside it is mounted too (git-mounts.ts) */
    tenantRoot?: string | null;
    timeoutMs: number;
    signal?: AbortSignal;
    /** runProcess (a test gives its own) */
    run?: typeof runProcess;
  },
): Promise<PhaseOutput> {
  const { argv, env, binds } = command();
  const git = await gitMountsOf(root, opts.tenantRoot ?? null);
  const options = { layers: opts.layers, identity: opts.identity ?? null, repositoryAbove: git.repositoryAbove, repository: git.repository };
  const r = await (opts.run ?? runProcess)(sandbox, [...argv, phase, JSON.stringify(options)], {
    workspace: root,
    readOnly: true,
    readOnlyBinds: git.readOnlyBinds,
    serviceBinds: binds,
    env: { ...ENV, ...env },
    network: false,
    maxBytes: PHASE_OUTPUT_MAX_BYTES,
    timeoutMs: opts.timeoutMs,
    signal: opts.signal,
  });
  if (r.timed_out) throw new PhaseError('timed_out', `the ${phase} phase did not end within ${Math.round(opts.timeoutMs / 1000)} s`);
  // stopped by its signal (the audit was canceled): said so, not as the signal it exited by; the reason, when the
  // abort gave one as text, says why
  if (r.aborted && (r.exit_code !== 0 || r.truncated)) {
    const reason: unknown = opts.signal?.reason;
    throw new PhaseError('failed', `the ${phase} phase was canceled${typeof reason === 'string' ? `: ${reason}` : ''}`);
  }
  if (r.exit_code !== 0 || r.truncated) {
    // the line that says what went wrong: a fatal error (out of memory) or a thrown error, else the first
    const lines = r.stderr
      .split('\n')
      .map((l) => l.trim())
      .filter(Boolean);
    const said = lines.find((l) => /FATAL ERROR|out of memory|^\w*Error\b/.test(l)) ?? lines[0];
    // a process the kernel ended for the sandbox's memory is said so, as a gate's is: the exit alone (137) reads
    // as the phase's own failure
    const memory = r.out_of_memory
      ? `it ran out of memory (over the sandbox's ${sandbox.limits?.memoryMb} MB, SERVICE_SANDBOX_MEMORY_MB)${said ? `: ${said}` : ''}`
      : r.cpu_exceeded
        ? `it used its ${sandbox.limits?.cpuSeconds} s of CPU time (SERVICE_SANDBOX_CPU_SECONDS)`
        : null;
    const why = r.truncated ? 'its output was too large' : (memory ?? said ?? `it exited ${r.exit_code ?? r.signal}`);
    throw new PhaseError('failed', `the ${phase} phase failed: ${why.slice(0, 500)}`);
  }
  try {
    return JSON.parse(r.stdout) as PhaseOutput;
  } catch {
    throw new PhaseError('failed', `the ${phase} phase printed no report`);
  }
}
