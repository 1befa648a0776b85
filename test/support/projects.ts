// Workspaces the gate tests make: a small TypeScript project with a git repository and a gate set.
import { execFileSync } from 'node:child_process';
import fs from 'node:fs/promises';
import path from 'node:path';
import { PROJECT_ROOT } from '../../config/paths.js';

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
