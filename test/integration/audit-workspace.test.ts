// What a phase makes of a workspace that changes, or is large, while it is audited: the cap of files
// holds outside a repository too, the architecture phase reads a private copy of the sources (a source
// swapped for a FIFO or removed after the listing is left out; it neither holds the phase nor fails it),
// sources over the size bound are left out of the import graph, and a phase the kernel ended for memory
// says so.
import { execFile, execFileSync } from 'node:child_process';
import fs from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import { pathToFileURL } from 'node:url';
import { expect } from 'chai';
import { architecturePhase } from '../../engine/audit/phases/architecture.js';
import { Findings, openWorkspace } from '../../engine/audit/phases/workspace.js';
import { runPhase } from '../../engine/audit/run-phase.js';
import { openAuditSandbox } from '../support/audit-sandbox.js';
import { PLANTED_TOKEN } from '../support/projects.js';
import { type ProcessResult, type Sandbox } from '../../engine/tools/index.js';

const here = path.dirname(new URL(import.meta.url).pathname);
const engine = (rel: string) => pathToFileURL(path.join(here, '../../engine/audit/phases', rel)).href;

async function write(root: string, files: Record<string, string>): Promise<void> {
  for (const [rel, text] of Object.entries(files)) {
    await fs.mkdir(path.dirname(path.join(root, rel)), { recursive: true });
    await fs.writeFile(path.join(root, rel), text);
  }
}

function git(cwd: string, ...args: string[]): void {
  execFileSync('git', ['-c', 'user.name=t', '-c', 'user.email=t@t', ...args], { cwd });
}

describe('audit workspace: caps, and files that change while a phase reads them', function () {
  this.timeout(60_000);
  let base: string;
  let sandbox: Sandbox;
  before(async () => {
    base = await fs.realpath(await fs.mkdtemp(path.join(os.tmpdir(), 'audit-workspace-')));
    sandbox = openAuditSandbox('audit-workspace');
  });
  after(async () => {
    sandbox.close();
    await fs.rm(base, { recursive: true, force: true });
  });

  it('keeps at most the cap of files outside a repository, one folder of more files included, and says it truncated only when there were more', async () => {
    const flat = path.join(base, 'flat');
    await write(flat, Object.fromEntries(Array.from({ length: 25 }, (_, i) => [`many/f${String(i).padStart(2, '0')}.txt`, 'x'])));
    await write(flat, { 'a.txt': 'x' });
    const ws = await openWorkspace(flat, { maxFiles: 10 });
    expect(ws.files).to.have.length(10);
    expect(ws.truncated).to.equal(true);
    // the first in order, as in a repository
    expect(ws.files).to.deep.equal(['a.txt', ...Array.from({ length: 9 }, (_, i) => `many/f0${i}.txt`)]);
    // exactly the cap is not truncated; one more is
    expect(await openWorkspace(flat, { maxFiles: 26 })).to.deep.include({ truncated: false });
    expect((await openWorkspace(flat, { maxFiles: 26 })).files).to.have.length(26);
    expect(await openWorkspace(flat, { maxFiles: 25 })).to.deep.include({ truncated: true });
    // a repository's files the same way
    git(flat, 'init', '-q');
    const repo = await openWorkspace(flat, { maxFiles: 10 });
    expect(repo.files).to.deep.equal(ws.files);
    expect(repo.truncated).to.equal(true);
  });

  it('security: scans the files a repository tracks under node_modules (vendored), and counts the untracked ones it leaves out', async () => {
    const root = path.join(base, 'vendored');
    const config = `export const token = '${PLANTED_TOKEN}';\n`;
    await write(root, { 'src/config.js': config, 'vendor/node_modules/lib/config.js': config, 'README.md': 'r' });
    git(root, 'init', '-q');
    git(root, 'add', '-A');
    git(root, 'commit', '-qm', 'vendored');
    // installed and not ignored: not the repository's, left out and counted, never in silence
    await write(root, { 'node_modules/dep/index.js': config });
    const out = await runPhase(sandbox, root, 'security', { layers: null, timeoutMs: 60_000 });
    const secrets = out.findings.filter((f) => f.rule.startsWith('secret:')).map((f) => f.file);
    expect(secrets).to.have.members(['src/config.js', 'vendor/node_modules/lib/config.js']);
    expect(out.metrics).to.deep.include({ files_scanned: 3, node_modules_untracked_skipped: 1 });
    expect(JSON.stringify(out)).not.to.contain(PLANTED_TOKEN);
  });

  /** a workspace of four sources, listed, then changed by `swap` before the architecture phase reads it */
  async function swapped(name: string, swap: (root: string) => Promise<void>) {
    const root = path.join(base, name);
    await write(root, {
      'package.json': '{"name":"s","dependencies":{}}',
      'src/index.ts': "import { a } from './a';\nimport { c } from './c';\nimport { d } from './d';\nexport const x = a + c + d;\n",
      'src/a.ts': 'export const a = 1;\n',
      'src/c.ts': 'export const c = 1;\n',
      'src/d.ts': 'export const d = 1;\n',
    });
    const ws = await openWorkspace(root);
    expect(ws.files).to.include.members(['src/a.ts', 'src/c.ts']);
    await swap(root);
    // in a process of its own: a phase that reads a FIFO blocks in open(2), event loop and all (for good: the bound
    // only has to end it; 4 files' phase took 17-20 s under a full suite's load, 2 s alone)
    const script = `
      import { architecturePhase } from ${JSON.stringify(engine('architecture.ts'))};
      import { Findings } from ${JSON.stringify(engine('workspace.ts'))};
      const findings = new Findings(1000);
      const metrics = await architecturePhase(${JSON.stringify(ws)}, findings, null);
      process.stdout.write(JSON.stringify({ metrics, findings: findings.result().findings }));
    `;
    const t0 = performance.now();
    const out = await new Promise<{ err: Error | null; stdout: string; stderr: string }>((resolve) =>
      execFile(process.execPath, ['--import', 'tsx', '--input-type=module', '-e', script], { timeout: 45_000, killSignal: 'SIGKILL' }, (err, stdout, stderr) =>
        resolve({ err, stdout, stderr }),
      ),
    );
    const ms = Math.round(performance.now() - t0);
    expect(out.err, `the phase failed or was held (${ms} ms): ${out.stderr.slice(0, 500)}`).to.equal(null);
    return JSON.parse(out.stdout) as { metrics: Record<string, unknown>; findings: { rule: string; file: string; message: string }[] };
  }

  it('architecture: a source swapped for a FIFO after the listing is left out; the phase does not wait for it', async () => {
    const { metrics, findings } = await swapped('fifo', async (root) => {
      await fs.rm(path.join(root, 'src/a.ts'));
      execFileSync('mkfifo', [path.join(root, 'src/a.ts')]);
    });
    expect(metrics.sources_not_read).to.deep.equal({ too_large: 0, gone: 1 });
    expect(metrics.source_files).to.equal(4);
    expect((metrics.largest_files as { file: string }[]).map((f) => f.file).sort()).to.deep.equal(['src/c.ts', 'src/d.ts', 'src/index.ts']);
    expect(findings.filter((f) => f.rule === 'unresolvable-import').map((f) => f.message)).to.deep.equal(['src/index.ts imports ./a, which does not exist']);
  });

  it('architecture: sources removed, or removed and made again, after the listing do not fail the phase', async () => {
    const { metrics, findings } = await swapped('removed', async (root) => {
      await fs.rm(path.join(root, 'src/c.ts'));
      // made again as a folder: still no regular file
      await fs.rm(path.join(root, 'src/d.ts'));
      await fs.mkdir(path.join(root, 'src/d.ts'));
    });
    expect(metrics.sources_not_read).to.deep.equal({ too_large: 0, gone: 2 });
    // what is there now is audited: index.ts and a.ts; the two left out are not there to import
    expect((metrics.largest_files as { file: string }[]).map((f) => f.file).sort()).to.deep.equal(['src/a.ts', 'src/index.ts']);
    expect(findings.filter((f) => f.rule === 'unresolvable-import').map((f) => f.message)).to.have.members([
      'src/index.ts imports ./c, which does not exist',
      'src/index.ts imports ./d, which does not exist',
    ]);
  });

  it('architecture: a source over the size bound is left out of the import graph and the measures (imports of it still resolve)', async () => {
    const root = path.join(base, 'large');
    await write(root, {
      'package.json': '{"name":"l","dependencies":{}}',
      'src/index.ts': "import { big } from './big';\nexport const x = big;\n",
      // over the bound of 200 bytes: its import of a missing file and of an undeclared package are not read
      'src/big.ts': `import { y } from './missing';\nimport z from 'undeclared-pkg';\nexport const big = [y, z];\n${'// padding\n'.repeat(50)}`,
      // a source git ignores (generated) that a listed one imports exists: not reported as missing
      '.gitignore': 'gen/\n',
      'gen/schema.ts': 'export const s = 1;\n',
      'src/uses-gen.ts': "import { s } from '../gen/schema';\nexport const u = s;\n",
    });
    git(root, 'init', '-q');
    const ws = await openWorkspace(root);
    expect(ws.files).not.to.include('gen/schema.ts');
    const findings = new Findings(1000);
    const metrics = await architecturePhase(ws, findings, null, { maxSourceBytes: 200 });
    const listed = findings.result().findings;
    expect(listed.filter((f) => f.rule === 'unresolvable-import' || f.rule === 'undeclared-package')).to.deep.equal([]);
    expect(listed.filter((f) => f.rule === 'source-not-read').map((f) => f.file)).to.deep.equal(['src/big.ts']);
    expect(metrics.sources_not_read).to.deep.equal({ too_large: 1, gone: 0 });
    expect((metrics.largest_files as { file: string }[]).map((f) => f.file)).not.to.include('src/big.ts');
  });

  it('architecture: a sparse source of 3 GB is not read: the phase in the sandbox ends at once, not out of memory', async () => {
    const root = path.join(base, 'sparse');
    await write(root, { 'package.json': '{"name":"p","dependencies":{}}', 'src/index.ts': "import { dep } from './dep';\nexport const x = dep;\n" });
    const handle = await fs.open(path.join(root, 'src/dep.ts'), 'w');
    await handle.truncate(3 * 1024 ** 3);
    await handle.close();
    const out = await runPhase(sandbox, root, 'architecture', { layers: null, timeoutMs: 45_000 });
    expect(out.metrics.sources_not_read).to.deep.equal({ too_large: 1, gone: 0 });
    expect(out.findings.filter((f) => f.rule === 'unresolvable-import')).to.deep.equal([]);
  });

  it('says a phase the kernel ended for memory ran out of memory, not only its exit', async () => {
    const oom: ProcessResult = {
      exit_code: null,
      signal: 'SIGKILL',
      stdout: '',
      stderr: '',
      truncated: false,
      timed_out: false,
      aborted: false,
      cpu_exceeded: false,
      out_of_memory: true,
      duration_ms: 13_000,
    };
    const err = await runPhase(sandbox, base, 'architecture', { layers: null, timeoutMs: 45_000, run: async () => oom }).catch((e: unknown) => e);
    expect(err).to.have.property('status', 'failed');
    expect((err as Error).message).to.match(/^the architecture phase failed: it ran out of memory \(over the sandbox's 4096 MB, SERVICE_SANDBOX_MEMORY_MB\)/);
    const exited = await runPhase(sandbox, base, 'architecture', {
      layers: null,
      timeoutMs: 45_000,
      run: async () => ({ ...oom, signal: null, exit_code: 137, stderr: 'something\n' }),
    }).catch((e: unknown) => e);
    expect((exited as Error).message)
      .to.contain('ran out of memory')
      .and.to.contain('something');
  });
});
