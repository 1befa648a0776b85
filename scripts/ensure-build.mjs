#!/usr/bin/env node
// Runs before `npm start` and `npm run cli`. In development it brings dist/ up to date (tsc, incremental:
// a second run takes a few seconds). In production, or where devDependencies were pruned, it builds nothing: the platform's build step ran
// `npm run build` while devDependencies were installed, and dist/ must be there.
import { spawnSync } from 'node:child_process';
import fs from 'node:fs';
import { createRequire } from 'node:module';
import path from 'node:path';
import { fileURLToPath } from 'node:url';

const root = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '..');
const require = createRequire(import.meta.url);
// pruned to production dependencies (npm prune --omit=dev), whatever NODE_ENV says: a devDependency is
// gone, tsc may be too, so nothing is built and dist/ must be there
const devDependencies = Object.keys(JSON.parse(fs.readFileSync(path.join(root, 'package.json'), 'utf8')).devDependencies ?? {});
const pruned = devDependencies.some((name) => !fs.existsSync(path.join(root, 'node_modules', name, 'package.json')));
if (process.env.NODE_ENV === 'production' || pruned) {
  if (!fs.existsSync(path.join(root, 'dist', 'main.js'))) {
    process.stderr.write('dist/ is missing: run `npm run build` in the build step (before devDependencies are pruned), then start.\n');
    process.exit(1);
  }
  process.exit(0);
}
const tsc = require.resolve('typescript/bin/tsc');
// --no-check: emit only, for a caller that type-checks the same sources beside it (`npm test`'s pretest); the
// output is the same (isolatedModules: each file is emitted on its own), in half the time
const check = process.argv.includes('--no-check') ? ['--noCheck'] : [];
const built = spawnSync(process.execPath, [tsc, '-p', path.join(root, 'tsconfig.build.json'), ...check], { stdio: 'inherit', cwd: root });
if (built.status !== 0) process.exit(built.status ?? 1);
const spec = spawnSync(process.execPath, [path.join(root, 'scripts', 'openapi-json.mjs')], { stdio: 'inherit', cwd: root });
process.exit(spec.status ?? 1);
