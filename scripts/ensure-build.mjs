#!/usr/bin/env node
// Runs before `npm start` and `npm run cli`. In development it brings dist/ up to date (tsc, incremental:
// a second run takes a few seconds). In production it builds nothing: the platform's build step ran
// `npm run build` while devDependencies were installed, and dist/ must be there.
import { spawnSync } from 'node:child_process';
import fs from 'node:fs';
import { createRequire } from 'node:module';
import path from 'node:path';
import { fileURLToPath } from 'node:url';

const root = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '..');
if (process.env.NODE_ENV === 'production') {
  if (!fs.existsSync(path.join(root, 'dist', 'main.js'))) {
    process.stderr.write('dist/ is missing: run `npm run build` in the build step (before devDependencies are pruned), then start.\n');
    process.exit(1);
  }
  process.exit(0);
}
const tsc = createRequire(import.meta.url).resolve('typescript/bin/tsc');
const built = spawnSync(process.execPath, [tsc, '-p', path.join(root, 'tsconfig.build.json')], { stdio: 'inherit', cwd: root });
process.exit(built.status ?? 1);
