// Gates on a real small TypeScript project made here: a gate set file checked with every error named,
// one gate that passes (tsc), one that fails (node's test runner, read as TAP), one that times out,
// one that looks for the service's secrets (which are not there), and the secret scan, all in the
// real sandbox; the reports' parsers; subjects and digests.
import { execFileSync } from 'node:child_process';
import fs from 'node:fs/promises';
import os from 'node:os';
import path from 'node:path';
import { expect } from 'chai';
import {
  FileHasher,
  gateEnv,
  gitState,
  GATE_FILES,
  inputDigest,
  loadGateSet,
  maskedTail,
  parseReport,
  readReport,
  runGate,
  type GateContext,
} from '../../engine/gates/index.js';
import { readPlainFile } from '../../engine/gates/definition.js';
import { createLogger, GateSetInvalidError } from '../../engine/platform/index.js';
import { openSandbox, type Sandbox } from '../../engine/tools/index.js';
import { GATES_YAML, makeProject } from '../support/projects.js';

const TOKEN = `ghp_${'x1Y2'.repeat(9)}`;

describe('gates', function () {
  this.timeout(60_000);
  let dir: string;
  let sandbox: Sandbox;
  before(async () => {
    dir = await fs.realpath(await fs.mkdtemp(path.join(os.tmpdir(), 'gates-')));
    sandbox = openSandbox({
      mode: 'auto',
      limits: { cpuSeconds: 60, memoryMb: 4096, processes: 256, fileSizeMb: 64 },
      prefix: 'gates-test',
      pathVar: process.env.PATH,
      log: createLogger('silent'),
    });
  });
  after(async () => {
    sandbox.close();
    await fs.rm(dir, { recursive: true, force: true });
  });

  /** A gate that runs a shell command and passes on exit 0 (`more` overrides any field) */
  const shellGate = (id: string, run: string, more: object = {}) =>
    ({
      id,
      name: id,
      required: true,
      run: ['/bin/sh', '-c', run],
      builtin: null,
      timeout_seconds: 30,
      env: [],
      pass: 'exit_code',
      report: null,
      inputs: null,
      artifacts: [],
      digest: 'sha256:x',
      ...more,
    }) as never;

  /** A gate context on a folder that is no repository, with nothing of the service's environment */
  const plainContext = (workspace: string, on: Sandbox = sandbox): GateContext => ({
    sandbox: on,
    workspace,
    workspaceName: '.',
    git: { commit: null, tree: null, dirty: null, files: null, committed: null },
    hasher: new FileHasher(),
    baseEnv: { PATH: '/usr/bin:/bin' },
    envValue: () => undefined,
    network: false,
  });

  it('names every problem of a gate set file at once, and detects a set from package.json without one', async () => {
    const bad = path.join(dir, 'bad');
    await fs.mkdir(bad);
    await fs.writeFile(
      path.join(bad, 'gates.yaml'),
      'gates:\n  - id: a\n    run: [x]\n    colour: red\n  - id: a\n    builtin: secret-scan\n  - id: B!\n  - id: c\n    run: "echo hi"\n  - id: d\n    run: [x]\n    pass: report\n  - id: seal\n    run: [x]\n',
    );
    const err = await loadGateSet(bad).catch((e: unknown) => e);
    expect(err).to.be.instanceOf(GateSetInvalidError);
    const paths = (err as GateSetInvalidError).errors.map((e) => `${e.path} ${e.message}`);
    expect(paths.join('\n')).to.contain('/gates/0 has an unknown field colour').and.contain('/gates/2/id');
    // the service's own rules too, with the schema's: one answer names them all
    expect(paths).to.include.members([
      '/gates/1/id repeats the id a',
      '/gates/2 needs either run or builtin',
      '/gates/3/run must be an argv array (or set shell: true)',
      '/gates/4/report is required when pass is report',
      // the gate run's own job has that id (a gate of it was never run, its gate run held until its budget ended)
      "/gates/5/id seal is reserved (the gate run's own job); choose another id",
    ]);
    await fs.writeFile(
      path.join(bad, 'gates.yaml'),
      'gates:\n  - id: a\n    run: [x]\n  - id: a\n    builtin: secret-scan\n  - id: c\n    run: "echo hi"\n  - id: d\n    run: [x]\n    pass: report\n',
    );
    const again = (await loadGateSet(bad).catch((e: unknown) => e)) as GateSetInvalidError;
    expect(again.errors.map((e) => `${e.path} ${e.message}`)).to.deep.equal([
      '/gates/1/id repeats the id a',
      '/gates/2/run must be an argv array (or set shell: true)',
      '/gates/3/report is required when pass is report',
    ]);
    await fs.rm(path.join(bad, 'gates.yaml'));
    await fs.writeFile(path.join(bad, 'package.json'), JSON.stringify({ scripts: { test: 'x', lint: 'y', start: 'z' } }));
    const detected = await loadGateSet(bad);
    expect(detected.source).to.equal('detected');
    expect(detected.gates.map((g) => [g.id, g.run, g.builtin])).to.deep.equal([
      ['lint', ['npm', 'run', '--silent', 'lint'], null],
      ['test', ['npm', 'test', '--silent'], null],
      ['secrets', null, 'secret-scan'],
    ]);
    expect(GATE_FILES).to.deep.equal(['gates.yaml', '.gates.yaml']);
  });

  it('reads TAP, JUnit XML, ESLint JSON and tsc output into a verdict and annotations', async () => {
    const tap = await parseReport(
      'tap',
      'TAP version 13\nok 1 - a\nnot ok 2 - b\n  ---\n  at:\n    fileName: test/b.js\n    lineNumber: 7\n  ...\n1..2\n',
      '/w',
    );
    expect(tap).to.deep.include({ ok: false, summary: '1 of 2 passed, 1 failed' });
    expect(tap.annotations[0]).to.deep.include({ path: 'test/b.js', line: 7, level: 'failure' });
    const junit = await parseReport(
      'junit',
      '<testsuites><testsuite name="s"><testcase classname="C" name="ok"/><testcase classname="C" name="bad" file="/w/src/c.ts"><failure message="expected 2">trace</failure></testcase></testsuite></testsuites>',
      '/w',
    );
    expect(junit.ok).to.equal(false);
    expect(junit.annotations).to.deep.equal([{ path: 'src/c.ts', line: null, level: 'failure', title: 'C bad', message: 'expected 2' }]);
    const eslint = await parseReport(
      'eslint',
      JSON.stringify([{ filePath: '/w/a.js', messages: [{ line: 3, severity: 1, message: 'unused', ruleId: 'no-unused-vars' }] }]),
      '/w',
    );
    expect(eslint).to.deep.include({ ok: true, summary: '0 errors, 1 warning' });
    const tsc = await parseReport('tsc', "src/a.ts(4,7): error TS2322: Type 'string' is not assignable to type 'number'.\n", '/w');
    expect(tsc.annotations).to.deep.equal([
      { path: 'src/a.ts', line: 4, level: 'failure', message: "TS2322: Type 'string' is not assignable to type 'number'." },
    ]);
    expect((await parseReport('junit', 'not xml at all <', '/w')).ok).to.equal(false);
    // nested suites (PHPUnit's shape): a failure two levels down fails, and an outer suite with no cases of its own still counts
    const nested = await parseReport(
      'junit',
      '<testsuites><testsuite name="all"><testcase name="smoke"/><testsuite name="inner"><testcase name="broken"><failure/></testcase></testsuite></testsuite></testsuites>',
      '/w',
    );
    expect(nested).to.deep.include({ ok: false, summary: '1 of 2 passed' });
    const passing = await parseReport(
      'junit',
      '<testsuites><testsuite name="all"><testsuite name="inner"><testcase name="fine"/></testsuite></testsuite></testsuites>',
      '/w',
    );
    expect(passing).to.deep.include({ ok: true, summary: '1 of 1 passed' });
    // a TAP stream that fails as a whole says why: fewer tests than its plan, no plan, a bail out
    const short = await parseReport('tap', 'TAP version 13\n1..5\nok 1 a\nok 2 b\n', '/w');
    expect(short).to.deep.include({ ok: false, summary: '2 of 2 passed; the plan says 5 tests; 2 reported' });
    expect(short.annotations).to.deep.equal([{ path: null, line: null, level: 'failure', message: 'the plan says 5 tests; 2 reported' }]);
    expect((await parseReport('tap', 'ok 1 a\nok 2 b\n', '/w')).annotations[0]!.message).to.contain('no plan');
    expect(await parseReport('tap', 'ok 1 a\nBail out! db down\n', '/w')).to.deep.include({ ok: false, summary: '1 of 1 passed; bailed out: db down' });
    expect(await parseReport('tap', 'ok 1 a\nBail out!\n', '/w')).to.deep.include({ ok: false, summary: '1 of 1 passed; bailed out' });
    // an id used twice is said once, and the failing test point that reused it still counts as failed
    expect(await parseReport('tap', '1..2\nok 1 a\nnot ok 1 b\n', '/w')).to.deep.include({
      ok: false,
      summary: '1 of 2 passed, 1 failed; test point id 1 appears multiple times',
    });
    // a large report is read on a thread of its own: the same answer, and the event loop goes on meanwhile
    const large = `1..60000\n${Array.from({ length: 60_000 }, (_, i) => (i % 1000 ? `ok ${i + 1} t${i}` : `not ok ${i + 1} t${i}`)).join('\n')}\n`;
    expect(large.length).to.be.above(512 * 1024);
    let longest = 0;
    let last = performance.now();
    const ticker = setInterval(() => {
      longest = Math.max(longest, performance.now() - last);
      last = performance.now();
    }, 5);
    const started = performance.now();
    const threaded = await readReport('tap', large, '/w').finally(() => clearInterval(ticker));
    const took = performance.now() - started;
    const inline = await parseReport('tap', large, '/w');
    expect(threaded).to.deep.equal(inline);
    expect(threaded).to.deep.include({ ok: false, summary: '59940 of 60000 passed, 60 failed' });
    expect(longest, `the loop stalled ${longest.toFixed(0)} ms during a ${took.toFixed(0)} ms read`).to.be.below(Math.max(150, took / 3));
    // skipped and to-do points are not passes; the summary says what they were
    expect(await parseReport('tap', '1..3\nok 1 a # SKIP x\nok 2 b # SKIP y\nnot ok 3 c # TODO z\n', '/w')).to.deep.include({
      summary: '0 of 3 passed, 2 skipped, 1 to do',
    });
    // reports that count more than they show: a suite's tests, a file's ESLint errors
    expect(await parseReport('junit', '<testsuite name="s" tests="3"><testcase name="a"/></testsuite>', '/w')).to.deep.include({
      ok: false,
      summary: '1 of 1 passed',
    });
    expect(await parseReport('junit', '<testsuites tests="50"><testsuite name="s"><testcase name="a"/></testsuite></testsuites>', '/w')).to.deep.include({
      ok: false,
    });
    const dropped = await parseReport('eslint', JSON.stringify([{ filePath: '/w/a.js', errorCount: 5, messages: [] }]), '/w');
    expect(dropped).to.deep.include({ ok: false, summary: '1 error, 0 warnings' });
    expect(dropped.annotations[0]!.message).to.equal('the report counts 5 errors in this file; it shows 0');
    // tsc --pretty: colours, file:line:col - error
    const pretty = await parseReport(
      'tsc',
      "\u001b[96msrc/a.ts\u001b[0m:\u001b[93m4\u001b[0m:\u001b[93m7\u001b[0m - \u001b[91merror\u001b[0m\u001b[90m TS2322: \u001b[0mType 'string' is not assignable.\n",
      '/w',
    );
    expect(pretty).to.deep.include({ ok: false, summary: '1 type error' });
    expect(pretty.annotations[0]).to.deep.include({ path: 'src/a.ts', line: 4 });
    // a report cut off while it was written is not read as what it holds so far
    const cut = await parseReport('junit', '<testsuites><testsuite name="s"><testcase name="a"/><testcase name="b">', '/w');
    expect(cut).to.deep.include({ ok: false, summary: 'the junit report could not be read' });
    // a suite that counts a failure its cases do not show (a crash in a hook), or has an error of its own
    // (collection, set-up), fails; the root's count is checked too
    const counted = await parseReport(
      'junit',
      '<testsuites><testsuite name="s" tests="2" failures="1"><testcase name="a"/><testcase name="b"/></testsuite></testsuites>',
      '/w',
    );
    expect(counted.ok).to.equal(false);
    expect(counted.annotations[0]).to.deep.include({ title: 's', message: 'the suite reports 1 failures and errors; its test cases show 0' });
    const own = await parseReport(
      'junit',
      '<testsuite name="s" errors="1"><error message="collection failed">trace</error><testcase name="a"/></testsuite>',
      '/w',
    );
    expect(own).to.deep.include({ ok: false, summary: '1 of 1 passed, 1 failures and errors outside the test cases' });
    expect(own.annotations).to.deep.equal([{ path: null, line: null, level: 'failure', title: 's (the suite itself)', message: 'collection failed' }]);
    const root = await parseReport('junit', '<testsuites errors="2"><testsuite name="s"><testcase name="a"/></testsuite></testsuites>', '/w');
    expect(root.ok).to.equal(false);
    // counts that agree with the cases (PHPUnit's outer suite counts its inner suites') add nothing
    const agreed = await parseReport(
      'junit',
      '<testsuites failures="1"><testsuite name="all" failures="1"><testsuite name="inner" failures="1"><testcase name="x"><failure message="no"/></testcase><testcase name="y"><skipped/></testcase></testsuite></testsuite></testsuites>',
      '/w',
    );
    expect(agreed).to.deep.include({ ok: false, summary: '0 of 2 passed, 1 skipped' });
    expect(agreed.annotations).to.have.length(1);
    // one message of megabytes is kept cut, not whole (in the result, the run and the ledger)
    const huge = await parseReport(
      'eslint',
      JSON.stringify([{ filePath: '/w/a.js', messages: [{ line: 1, severity: 1, message: 'x'.repeat(3_000_000) }] }]),
      '/w',
    );
    expect(huge.annotations[0]!.message.length).to.equal(1000);
  });

  it('sees a rewrite of an input too large to read whole, though its size stayed the same', async () => {
    const dir = await fs.mkdtemp(path.join(os.tmpdir(), 'gates-large-'));
    try {
      const file = path.join(dir, 'data.bin');
      await fs.writeFile(file, 'A');
      await fs.truncate(file, 65 * 1024 * 1024); // past what is hashed whole, sparse
      const hasher = new FileHasher();
      const before = await hasher.digest(dir, ['data.bin']);
      const handle = await fs.open(file, 'r+');
      await handle.write(Buffer.from('B'), 0, 1, 0);
      await handle.close();
      expect(await hasher.digest(dir, ['data.bin'])).not.to.equal(before);
    } finally {
      await fs.rm(dir, { recursive: true, force: true });
    }
  });

  it('keeps no part of a private key in the output tail, where the cut would halve it or an earlier cut did', async () => {
    const body = Array.from({ length: 25 }, (_, i) => `MIIEvQIBADANBgkqhkiG9w0BAQEFAASCBKcwggSjAgEAAoIBAQC${String(i).padStart(13, 'x')}`).join('\n');
    const key = `-----BEGIN PRIVATE KEY-----\n${body}\n-----END PRIVATE KEY-----\n`;
    // the tail's 8 KB start inside the key
    const halved = await maskedTail(`${key}${'p'.repeat(8 * 1024 - 200)}\n`);
    expect(halved).not.to.match(/MIIEvQIBADAN|ggSjAgEAAoIBAQC/);
    expect(halved).to.contain('ppp');
    // the output kept only its own tail, which starts inside the key
    const orphan = await maskedTail(`${key.slice(200)}done\n`);
    expect(orphan).not.to.match(/ggSjAgEAAoIBAQC/);
    expect(orphan).to.contain('done');
  });

  it('counts a gate with pass: report as passing only when its command exited 0 and wrote the report this time', async () => {
    const project = await fs.mkdtemp(path.join(dir, 'report-'));
    const ctx = () => plainContext(project);
    const gate = (id: string, run: string, report: { format: 'junit' | 'eslint'; path?: string }) => shellGate(id, run, { pass: 'report', report });
    const good = '<testsuites><testsuite name="s"><testcase name="ok"/></testsuite></testsuites>';
    await fs.writeFile(path.join(project, 'old.xml'), good);
    await new Promise((r) => setTimeout(r, 1100));
    // an old passing report file, a command that exits 0 without writing one
    const stale = await runGate(gate('stale', 'true', { format: 'junit', path: 'old.xml' }), ctx());
    expect(stale.result.conclusion).to.equal('failure');
    // ESLint's fatal error: an empty list of results, exit 2
    const fatal = await runGate(gate('fatal', "echo '[]'; exit 2", { format: 'eslint' }), ctx());
    expect(fatal.result.conclusion).to.equal('failure');
    // written this time, exit 0: passes
    const fresh = await runGate(gate('fresh', `echo '${good}' > new.xml`, { format: 'junit', path: 'new.xml' }), ctx());
    expect(fresh.result.conclusion, fresh.result.summary).to.equal('success');
  });

  it('says a gate ran out of memory when the kernel ended a process of it for the step’s memory limit', async function () {
    if (sandbox.memoryLimit !== 'cgroup') this.skip();
    const small = openSandbox({
      mode: 'auto',
      limits: { cpuSeconds: 60, memoryMb: 200, processes: 64, fileSizeMb: 16 },
      prefix: 'gates-test',
      pathVar: process.env.PATH,
      log: createLogger('silent'),
    });
    try {
      const project = await fs.mkdtemp(path.join(dir, 'memory-'));
      const ctx = plainContext(project, small);
      // four processes of 100 MB each: each under its own address space limit, 400 MB together
      const hold = 'head -c 100000000 /dev/zero | tail > /dev/null';
      const gate = shellGate('hungry', `for i in 1 2 3 4; do (${hold}) & done; wait; exit 1`);
      const { result } = await runGate(gate, ctx);
      expect(result.conclusion).to.equal('failure');
      expect(result.summary).to.equal("ran out of memory (over the step's 200 MB, SERVICE_SANDBOX_MEMORY_MB); exited 1");
    } finally {
      small.close();
    }
  });

  it('says a gate’s process used its CPU seconds when the kernel ended it for them', async () => {
    const brief = openSandbox({
      mode: 'auto',
      limits: { cpuSeconds: 1, memoryMb: 256, processes: 64, fileSizeMb: 16 },
      prefix: 'gates-cpu-test',
      pathVar: process.env.PATH,
      log: createLogger('silent'),
    });
    try {
      const project = await fs.mkdtemp(path.join(dir, 'cpu-'));
      const { result } = await runGate(shellGate('spin', 'while :; do :; done'), plainContext(project, brief));
      expect(result.conclusion).to.equal('failure');
      expect(result.summary).to.equal('a process used its 1 s of CPU time (SERVICE_SANDBOX_CPU_SECONDS); exited 152');
    } finally {
      brief.close();
    }
  });

  it('lists every file of a repository whatever its name holds: a name with a newline or `@@` hides no file after it', async () => {
    const repo = await fs.mkdtemp(path.join(dir, 'names-'));
    const names = ['0@@\nx', 'a@@', 'b\n@@\n', 'src/z.ts', 'é @@.txt'];
    for (const name of names) {
      await fs.mkdir(path.dirname(path.join(repo, name)), { recursive: true });
      await fs.writeFile(path.join(repo, name), name);
    }
    const git = (...args: string[]) => execFileSync('git', ['-c', 'user.name=t', '-c', 'user.email=t@t', '-c', 'core.quotePath=false', ...args], { cwd: repo });
    git('init', '-q');
    git('add', '-A');
    git('commit', '-qm', 'init');
    const clean = await gitState(sandbox, repo);
    expect(clean.commit).to.match(/^[0-9a-f]{40}$/);
    expect(clean.dirty).to.equal(false);
    expect(clean.files).to.deep.equal([...names].sort());
    expect(clean.committed, 'the commit’s own files, read from its tree').to.have.members(names);
    // one untracked, named to look like the listing's old mark: the tree is dirty, and every file still listed
    await fs.writeFile(path.join(repo, 'new@@\nfile'), 'x');
    const dirty = await gitState(sandbox, repo);
    expect(dirty.dirty).to.equal(true);
    expect(dirty.files).to.have.members([...names, 'new@@\nfile']);
    expect(dirty.committed).to.have.members(names);
    expect((await gitState(sandbox, repo, [], { tracked: true })).dirty).to.equal(false);
  });

  it('runs a project’s gates in the sandbox: one passes, one fails with annotations, one times out, secrets stay out, the scan finds a token', async () => {
    const project = path.join(dir, 'project');
    await makeProject(project, GATES_YAML);
    await fs.writeFile(path.join(project, 'src', 'config.ts'), `export const token = '${TOKEN}';\n`);
    execFileSync('git', ['add', 'src/config.ts'], { cwd: project });
    const set = await loadGateSet(project);
    expect(set.source).to.equal('gates.yaml');
    const git = await gitState(sandbox, project);
    expect(git.commit).to.match(/^[0-9a-f]{40}$/);
    expect(git.dirty).to.equal(true); // config.ts is staged, not committed
    expect(git.files).to.include('src/config.ts').and.not.include('node_modules/typescript/package.json');
    const ctx: GateContext = {
      sandbox,
      workspace: project,
      workspaceName: 'project',
      git,
      hasher: new FileHasher(),
      baseEnv: { PATH: '/usr/local/bin:/usr/bin:/bin', HOME: '/tmp' },
      // the runner gives a gate only what the caller allows: here nothing of the service's own
      envValue: (name) => (name.startsWith('SERVICE_') ? undefined : { DATA_DIR_GUESS: '/var/lib/svc' }[name]),
      network: false,
    };
    const results = Object.fromEntries(await Promise.all(set.gates.map(async (g) => [g.id, (await runGate(g, ctx)).result] as const)));
    expect(results.typecheck!.conclusion, results.typecheck!.output_tail).to.equal('success');
    expect(results.typecheck!.subject).to.deep.equal({ workspace: 'project', commit: git.commit, tree: git.tree, dirty: true });
    expect(results.test!.conclusion).to.equal('failure');
    expect(results.test!.summary).to.equal('1 of 2 passed, 1 failed');
    expect(results.test!.annotations[0]).to.deep.include({ level: 'failure' });
    expect(results.test!.annotations[0]!.message).to.contain('is wrong');
    expect(results.slow!.conclusion).to.equal('timed_out');
    expect(results.slow!.duration_ms).to.be.below(5000);
    expect(results.peek!.output_tail).to.contain('key=[]');
    expect(results.secrets!.conclusion).to.equal('failure');
    expect(results.secrets!.annotations[0]).to.deep.include({ path: 'src/config.ts', line: 1 });
    // a found secret is masked wherever the result goes
    expect(JSON.stringify(results)).not.to.contain(TOKEN);
    for (const r of Object.values(results)) {
      expect(r.definition_digest).to.match(/^sha256:[0-9a-f]{64}$/);
      expect(r.tool_versions.node).to.match(/^v\d+/);
    }
    // the typecheck's inputs are its globs: a test file's change leaves its digest, a source change moves it
    const typecheck = set.gates.find((g) => g.id === 'typecheck')!;
    const before = results.typecheck!.input_digest;
    expect(await inputDigest(ctx, typecheck)).to.equal(before);
    await fs.appendFile(path.join(project, 'test', 'add.test.mjs'), '// more\n');
    expect(await inputDigest(ctx, typecheck)).to.equal(before);
    await fs.appendFile(path.join(project, 'src', 'add.ts'), '// more\n');
    const moved = await inputDigest(ctx, typecheck);
    expect(moved).not.to.equal(before);
    // a change that keeps the size and sets the mtime back is still seen (its change time moved)
    const file = path.join(project, 'src', 'add.ts');
    const ref = path.join(project, 'mtime-ref');
    execFileSync('touch', ['-r', file, ref]);
    const text = await fs.readFile(file, 'utf8');
    await fs.writeFile(file, text.replace('// more', '// mOre'));
    execFileSync('touch', ['-r', ref, file]); // to the nanosecond, as `touch -r` does
    expect((await fs.stat(file)).mtimeMs).to.equal((await fs.stat(ref)).mtimeMs);
    expect(await inputDigest(ctx, typecheck)).not.to.equal(moved);
  });

  it('reads a gate file and package.json through one handle that follows no link: one swapped for a link to another tenant’s file after a check is never read', async () => {
    const tenants = path.join(dir, 'swap');
    const alpha = path.join(tenants, 'alpha');
    const beta = path.join(tenants, 'beta');
    await fs.mkdir(alpha, { recursive: true });
    await fs.mkdir(beta);
    await fs.writeFile(path.join(beta, 'cfg.yml'), 'beta_db_password_hunter2: yes\n');
    await fs.writeFile(path.join(beta, 'package.json'), JSON.stringify({ scripts: { test: 'beta-only', build: 'beta-only' } }));
    const plain = 'gates:\n  - id: a\n    run: [/bin/true]\n';
    // a tenant's step swaps a file for a link in a loop (a rename, so the name is never missing); here it
    // is done once, at the worst moment: just after the service looks at the file by name (lstat, stat),
    // or just before it opens or reads it by name
    let name = '';
    let target = '';
    let swapped = false;
    const swap = async (p: unknown) => {
      if (swapped || p !== path.join(alpha, name)) return;
      swapped = true;
      await fs.symlink(target, path.join(alpha, 'swap.tmp'));
      await fs.rename(path.join(alpha, 'swap.tmp'), path.join(alpha, name));
    };
    const { lstat, stat, open, readFile } = fs;
    type Fn = (...args: unknown[]) => Promise<unknown>;
    const after =
      (fn: Fn) =>
      async (...args: unknown[]) => {
        const result = await fn(...args);
        await swap(args[0]);
        return result;
      };
    const before =
      (fn: Fn) =>
      async (...args: unknown[]) => {
        await swap(args[0]);
        return fn(...args);
      };
    const hooked = fs as unknown as Record<string, Fn>;
    Object.assign(hooked, { lstat: after(lstat as Fn), stat: after(stat as Fn), open: before(open as Fn), readFile: before(readFile as Fn) });
    const armed = async (file: string, linkTo: string, content: string) => {
      await fs.rm(path.join(alpha, file), { force: true });
      await fs.writeFile(path.join(alpha, file), content);
      name = file;
      target = path.join('..', 'beta', linkTo);
      swapped = false;
    };
    try {
      await armed('gates.yaml', 'cfg.yml', plain);
      const err = await loadGateSet(alpha).catch((e: unknown) => e);
      expect(swapped, 'the file was swapped while the set loaded').to.equal(true);
      expect(String((err as Error).message)).to.not.contain('hunter2');
      expect(err).to.be.instanceOf(GateSetInvalidError);
      expect((err as Error).message).to.equal('gates.yaml is not a valid gate set: / must be a plain file');
      // a detected set: another tenant's scripts do not become this workspace's gates
      await fs.rm(path.join(alpha, 'gates.yaml'));
      await armed('package.json', 'package.json', JSON.stringify({ scripts: { lint: 'eslint .' } }));
      const detected = await loadGateSet(alpha);
      expect(swapped).to.equal(true);
      expect(detected.gates.map((g) => g.id)).to.deep.equal(['secrets']);
      // what a vibe run's copy gets its gate file and scripts from
      await armed('package.json', 'package.json', '{}');
      expect(await readPlainFile(alpha, 'package.json')).to.equal('not-plain');
      expect(swapped).to.equal(true);
    } finally {
      Object.assign(hooked, { lstat, stat, open, readFile });
    }
    // unswapped, the same files read as before; a FIFO is refused without waiting for a writer
    await armed('gates.yaml', 'cfg.yml', plain);
    expect((await loadGateSet(alpha)).gates.map((g) => g.id)).to.deep.equal(['a']);
    expect(await readPlainFile(alpha, 'gates.yaml')).to.deep.equal({ text: plain });
    expect(await readPlainFile(alpha, 'nothing.yaml')).to.equal('absent');
    expect(await readPlainFile(alpha, 'gates.yaml', 10)).to.equal('too-large');
    execFileSync('mkfifo', [path.join(alpha, 'fifo')]);
    expect(await readPlainFile(alpha, 'fifo')).to.equal('not-plain');
  });

  it('scans every input file for secrets: one past 1 MB (a chunk at a time, a key across a chunk’s border found once), one that looks binary, and fails naming one it cannot scan', async () => {
    const project = await fs.mkdtemp(path.join(dir, 'scan-all-'));
    const ctx = plainContext(project);
    const scan = (inputs: string[]) => runGate(shellGate('scan', '', { run: null, builtin: 'secret-scan', inputs }), ctx);
    const { privateKey } = (await import('node:crypto')).generateKeyPairSync('rsa', { modulusLength: 2048 });
    const pem = privateKey.export({ type: 'pkcs1', format: 'pem' }).toString();
    const secrets = `export const token = '${TOKEN}';\nexport const key = \`${pem}\`;\n`;
    await fs.writeFile(path.join(project, 'small.js'), secrets);
    const small = await scan(['small.js']);
    expect(small.result.conclusion).to.equal('failure');
    const found = small.result.annotations.length;
    expect(found, 'the token and the key').to.be.at.least(2);
    // the same secrets after a comment of 1 MB: no longer passed unread
    const comment = `// ${'x'.repeat(1024 * 1024)}\n`;
    await fs.writeFile(path.join(project, 'config.js'), comment + secrets);
    const large = await scan(['config.js']);
    expect(large.result.conclusion, large.result.summary).to.equal('failure');
    expect(large.result.annotations.map((a) => [a.line, a.title])).to.deep.equal(small.result.annotations.map((a) => [a.line! + 1, a.title]));
    // a file that looks binary (a NUL in its first 8 KB) is scanned byte for byte
    await fs.writeFile(path.join(project, 'blob.js'), Buffer.concat([Buffer.from('a\0b\n'), Buffer.from(secrets)]));
    const binary = await scan(['blob.js']);
    expect(binary.result.conclusion, binary.result.summary).to.equal('failure');
    expect(binary.result.annotations).to.have.length(found);
    // a key that lies across the border of two chunks (1 MB): whole in the second, counted once; lines counted from the file's start
    const lines = 1024;
    const filler = `${'y'.repeat(1023)}\n`.repeat(lines - 1) + 'y'.repeat(1024 - 800) + '\n';
    await fs.writeFile(path.join(project, 'border.txt'), filler + pem + 'z'.repeat(2 * 1024 * 1024) + '\n' + TOKEN + '\n');
    expect(Buffer.byteLength(filler))
      .to.be.below(1024 * 1024)
      .and.above(1024 * 1024 - pem.length);
    const border = await scan(['border.txt']);
    expect(border.result.conclusion, border.result.summary).to.equal('failure');
    expect(border.result.annotations.map((a) => a.line)).to.deep.equal([lines + 1, lines + pem.split('\n').length + 1]);
    expect(border.result.summary).to.equal('2 secrets found in 1 files');
    // a file it will not read (past 256 MB, sparse here) is named, and the scan does not pass without it
    await fs.writeFile(path.join(project, 'clean.txt'), 'nothing to see\n');
    await fs.writeFile(path.join(project, 'huge.bin'), '');
    await fs.truncate(path.join(project, 'huge.bin'), 300 * 1024 * 1024);
    const clean = await scan(['clean.txt']);
    expect(clean.result).to.deep.include({ conclusion: 'success', summary: 'no secrets in 1 files' });
    const unscanned = await scan(['clean.txt', 'huge.bin']);
    expect(unscanned.result.conclusion).to.equal('failure');
    expect(unscanned.result.summary).to.equal('no secrets in 1 files; 1 not scanned, so not passed: huge.bin (over 256 MB)');
  });

  it('holds the secret scan to its gate’s timeout and cancel: a few files of 256 MB are not read to the end', async () => {
    const project = await fs.mkdtemp(path.join(dir, 'scan-time-'));
    const names = ['big0.bin', 'big1.bin', 'big2.bin', 'big3.bin'];
    for (const name of names) {
      await fs.writeFile(path.join(project, name), '');
      await fs.truncate(path.join(project, name), 255 * 1024 * 1024); // sparse: no disk, and about 3 s of linting each
    }
    const gate = shellGate('scan', '', { run: null, builtin: 'secret-scan', inputs: ['big*'], timeout_seconds: 1 });
    let t0 = Date.now();
    const timed = await runGate(gate, plainContext(project));
    expect(Date.now() - t0, 'ended about its 1 s timeout').to.be.below(4000);
    expect(timed.result.conclusion).to.equal('timed_out');
    expect(timed.result.summary).to.match(/^did not end within 1 s \(\d of 4 files scanned\)$/);
    const controller = new AbortController();
    setTimeout(() => controller.abort(), 300);
    t0 = Date.now();
    const canceled = await runGate({ ...(gate as object), timeout_seconds: 600 } as never, { ...plainContext(project), signal: controller.signal });
    expect(Date.now() - t0, 'ended about its cancel').to.be.below(3000);
    expect(canceled.result).to.deep.include({ conclusion: 'cancelled', summary: 'stopped before it ended' });
  });

  it('keeps a gate’s summary masked and short: a TAP bail-out’s reason with a token and 3 MB after it', async () => {
    const project = await fs.mkdtemp(path.join(dir, 'bail-'));
    await fs.writeFile(path.join(project, 'tap.sh'), `printf '1..2\\nok 1 - a\\nBail out! token ${TOKEN} '\nhead -c 3000000 /dev/zero | tr '\\0' x\necho\n`);
    const ran = await runGate(shellGate('tap', 'sh tap.sh', { report: { format: 'tap' }, pass: 'report' }), plainContext(project));
    expect(ran.result.conclusion).to.equal('failure');
    expect(ran.result.summary).to.match(/^1 of 1 passed; bailed out: token \*\*\* x{900}/);
    expect(ran.result.summary).not.to.contain(TOKEN.slice(4));
    expect(ran.result.summary.length).to.be.at.most(1000);
  });

  it('keeps out of what a gate printed and reported the values it was given by name (env), which no secret pattern knows', async () => {
    const project = await fs.mkdtemp(path.join(dir, 'given-'));
    const deployKey = 'q7Zx9LmN2pRt5VwY8bKd3HfJ';
    const given: Record<string, string> = { DEPLOY_TOKEN: deployKey, REGION: 'eu', SHORT: 'abc' };
    const ctx = { ...plainContext(project), envValue: (name: string) => given[name] };
    const printing = shellGate('deploy', 'echo "token is $DEPLOY_TOKEN in $REGION"; echo "$DEPLOY_TOKEN" >&2; exit 1', { env: ['DEPLOY_TOKEN', 'REGION'] });
    const ran = await runGate(printing, ctx);
    expect(ran.result.output_tail).to.contain('token is [DEPLOY_TOKEN] in eu').and.not.contain(deployKey);
    // in a report the gate wrote too (its summary and annotations are made from it)
    const tap = shellGate('tap', 'printf "1..1\\nnot ok 1 - login as $DEPLOY_TOKEN\\n"', { env: ['DEPLOY_TOKEN'], report: { format: 'tap' }, pass: 'report' });
    const reported = await runGate(tap, ctx);
    expect(JSON.stringify(reported.result)).to.contain('[DEPLOY_TOKEN]').and.not.contain(deployKey);
  });

  it('asks the sandbox for its tool versions again after a failed probe, in a folder of its own: one failure does not fail every later gate', async () => {
    const project = await fs.mkdtemp(path.join(dir, 'versions-'));
    const probed: string[] = [];
    let failNext = true;
    const flaky: Sandbox = {
      ...sandbox,
      spawn: (command, opts) => {
        if (command.join(' ').includes('node --version')) {
          probed.push(opts.workspace);
          if (failNext) {
            failNext = false;
            throw new Error('the sandbox could not start (a moment’s cgroup failure)');
          }
        }
        return sandbox.spawn(command, opts);
      },
    };
    const first = await runGate(shellGate('ok', 'true'), plainContext(project, flaky));
    expect(first.result.conclusion).to.equal('success');
    expect(first.result.tool_versions).to.deep.equal({});
    const second = await runGate(shellGate('ok', 'true'), plainContext(project, flaky));
    expect(second.result.conclusion).to.equal('success');
    expect(Object.keys(second.result.tool_versions).sort()).to.deep.equal(['git', 'node', 'npm']);
    const third = await runGate(shellGate('ok', 'true'), plainContext(project, flaky));
    expect(third.result.tool_versions).to.deep.equal(second.result.tool_versions);
    expect(probed, 'asked twice: the failure was not kept, the answer was').to.have.length(2);
    for (const cwd of probed) expect(cwd.startsWith(project), 'not in the tenant’s workspace').to.equal(false);
  });

  it('keeps a bounded result whatever a gate leaves: at most 100 artifacts (tiny files each took a ledger payload), annotations within 64 KB', async () => {
    const project = await fs.mkdtemp(path.join(dir, 'bounded-'));
    const ctx = plainContext(project);
    const gate = (id: string, run: string, more: object) => shellGate(id, run, { inputs: [], ...more });
    // 3,000 one-byte files: 3 KB, far within the bytes a gate may keep, but one payload each
    const many = await runGate(
      gate('many', 'mkdir out && cd out && seq 1 3000 | xargs -n 500 touch && for f in *; do echo x > $f; done', { artifacts: ['out/**'] }),
      ctx,
    );
    expect(many.result.conclusion, many.result.output_tail).to.equal('success');
    expect(many.result.artifacts.length).to.be.at.most(100);
    expect(many.artifacts.length).to.equal(many.result.artifacts.length);
    // 200 failures whose name, file and message are each 1,000 characters long
    const long = (c: string) => c.repeat(1000);
    const tap = [
      'TAP version 13',
      ...Array.from(
        { length: 200 },
        (_, i) => `not ok ${i + 1} - ${long('n')}\n  ---\n  message: ${long('m')}\n  at:\n    fileName: ${long('f')}\n    lineNumber: 1\n  ...`,
      ),
      '1..200',
      '',
    ].join('\n');
    await fs.writeFile(path.join(project, 'big.tap'), tap);
    const loud = await runGate(gate('loud', 'cat big.tap; exit 1', { pass: 'report', report: { format: 'tap' } }), ctx);
    expect(loud.result.conclusion).to.equal('failure');
    expect(loud.result.annotations.length).to.be.above(0);
    expect(JSON.stringify(loud.result.annotations).length).to.be.at.most(70 * 1024);
    // the secret scan: 3,000 tokens are counted, not each kept
    await fs.writeFile(
      path.join(project, 'tokens.txt'),
      Array.from({ length: 3000 }, (_, i) => `t${i} = ghp_${String(i).padStart(4, '0')}${'x1Y2'.repeat(8)}`).join('\n'),
    );
    const scan = await runGate(gate('scan', '', { run: null, builtin: 'secret-scan', inputs: ['tokens.txt'] }), ctx);
    expect(scan.result.conclusion).to.equal('failure');
    expect(scan.result.summary).to.equal('3000 secrets found in 1 files');
    expect(scan.result.annotations.length).to.be.within(1, 200);
    expect(JSON.stringify(scan.result).length).to.be.at.most(100 * 1024);
  });

  it('reads no gate file through a workspace folder swapped for a link after it was resolved', async () => {
    const tenants = path.join(dir, 'moved');
    await fs.mkdir(path.join(tenants, 'alpha', 'ws'), { recursive: true });
    await fs.mkdir(path.join(tenants, 'beta'));
    await fs.writeFile(path.join(tenants, 'beta', 'gates.yaml'), 'beta_db_password_hunter2: yes\n');
    const ws = await fs.realpath(path.join(tenants, 'alpha', 'ws'));
    // the step moves its workspace away and puts a link to another tenant's folder in its place
    await fs.rename(ws, `${ws}.away`);
    await fs.symlink(path.join('..', 'beta'), ws);
    const err = (await loadGateSet(ws).catch((e: unknown) => e)) as Error;
    expect(err).to.be.instanceOf(GateSetInvalidError);
    expect(err.message).to.equal('gates.yaml is not a valid gate set: / must be a plain file');
  });

  it('reads nothing outside the workspace: .. and absolute paths are refused, a linked folder leads nowhere; a gate that cannot start fails; printed secrets are masked', async () => {
    const ws = path.join(dir, 'escape');
    await fs.mkdir(ws);
    const outside = path.join(dir, 'host-secret.txt');
    await fs.writeFile(outside, 'HOST-SECRET-1234567890');
    await fs.writeFile(
      path.join(ws, 'gates.yaml'),
      'gates:\n  - id: a\n    run: [x]\n    artifacts: [../host-secret.txt, /etc/passwd]\n    inputs: [../*]\n    report: { format: tap, path: ../host-secret.txt }\n',
    );
    const refused = (await loadGateSet(ws).catch((e: unknown) => e)) as GateSetInvalidError;
    expect(refused.errors.map((e) => e.path)).to.deep.equal(['/gates/0/inputs/0', '/gates/0/artifacts/0', '/gates/0/artifacts/1', '/gates/0/report/path']);
    // a committed link to a folder outside: the globs and the report path go through it to nothing
    await fs.symlink(dir, path.join(ws, 'up'));
    await fs.writeFile(
      path.join(ws, 'gates.yaml'),
      [
        'gates:',
        '  - id: linked',
        '    run: [/bin/true]',
        '    artifacts: [up/*]',
        '    inputs: [up/*, gates.yaml]',
        '    pass: report',
        '    report: { format: eslint, path: up/host-secret.txt }',
        '  - id: nothing',
        '    run: [no-such-program-here]',
        '    pass: report',
        '    report: { format: tsc }',
        '  - id: prints',
        `    run: 'echo token ${TOKEN}'`,
        '    shell: true',
        '  - id: reports',
        `    run: 'echo "<testsuite tests=\\"1\\" failures=\\"1\\"><testcase name=\\"uses ${TOKEN}\\" file=\\"cfg-${TOKEN}.js\\"><failure message=\\"saw ${TOKEN}\\"/></testcase></testsuite>"'`,
        '    shell: true',
        '    pass: report',
        '    report: { format: junit }',
        '',
      ].join('\n'),
    );
    const set = await loadGateSet(ws);
    const ctx: GateContext = {
      sandbox,
      workspace: ws,
      workspaceName: 'escape',
      git: await gitState(sandbox, ws),
      hasher: new FileHasher(),
      baseEnv: { PATH: '/usr/bin:/bin' },
      envValue: () => undefined,
      network: false,
    };
    const [linked, nothing, prints, reports] = await Promise.all(set.gates.map(async (g) => (await runGate(g, ctx)).result));
    expect(linked!.artifacts).to.deep.equal([]);
    expect(linked!.conclusion).to.equal('failure');
    expect(linked!.summary).to.equal('no eslint report in up/host-secret.txt');
    expect(JSON.stringify(linked)).not.to.contain('HOST-SECRET');
    expect(nothing!.conclusion).to.equal('failure');
    expect(nothing!.exit_code).to.equal(127);
    expect(prints!.output_tail).to.contain('token ***').and.not.contain(TOKEN);
    // a report's annotations are masked in every field: the test's name, its file, the message
    expect(reports!.conclusion).to.equal('failure');
    expect(reports!.annotations).to.have.length(1);
    expect(reports!.annotations[0]).to.deep.include({ title: 'uses ***', path: 'cfg-***.js' });
    expect(JSON.stringify(reports!.annotations)).to.not.contain(TOKEN);
    // the service and the CLI give a gate none of the service's own variables
    const env = gateEnv((name) => `value-of-${name}`);
    expect([env('SERVICE_SECRET_KEY'), env('REDIS_URL'), env('MONGODB_URI'), env('NPM_CONFIG_CACHE')]).to.deep.equal([
      undefined,
      undefined,
      undefined,
      'value-of-NPM_CONFIG_CACHE',
    ]);
  });
});
