#!/usr/bin/env node
// `npm test`'s first part: the type check, the format check and the build (dist/, which the tests' child
// processes run), side by side: each is one process, and together they keep both cores busy. Any one that
// fails fails the test command, its output shown.
import { spawn } from 'node:child_process';
import path from 'node:path';
import { fileURLToPath } from 'node:url';

const root = path.dirname(path.dirname(fileURLToPath(import.meta.url)));
const bin = (name) => path.join(root, 'node_modules', '.bin', name);
const checks = [
  ['type check', bin('tsc'), ['--noEmit', '-p', 'tsconfig.json']],
  ['format check', bin('prettier'), ['--check', '--log-level', 'warn', '.']],
  // the type check above covers the build's sources (tsconfig.json includes tsconfig.build.json's)
  ['build', process.execPath, [path.join(root, 'scripts', 'ensure-build.mjs'), '--no-check']],
];
const results = await Promise.all(
  checks.map(
    ([name, command, args]) =>
      new Promise((resolve) => {
        const child = spawn(command, args, { cwd: root, stdio: ['ignore', 'pipe', 'pipe'] });
        let out = '';
        child.stdout.on('data', (d) => (out += d));
        child.stderr.on('data', (d) => (out += d));
        child.on('error', (err) => resolve({ name, code: 1, out: `${out}${err.message}\n` }));
        child.on('close', (code) => resolve({ name, code, out }));
      }),
  ),
);
for (const r of results) if (r.out) process.stdout.write(`${r.name}:\n${r.out}`);
const failed = results.filter((r) => r.code !== 0);
for (const r of failed) process.stderr.write(`pretest: the ${r.name} failed (exit ${r.code})\n`);
process.exit(failed.length ? 1 : 0);
