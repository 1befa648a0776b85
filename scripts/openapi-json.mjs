#!/usr/bin/env node
// Part of the build (`npm run build`, scripts/ensure-build.mjs): api/openapi.yaml as JSON in
// dist/openapi.json, with the YAML's hash, which config/openapi-document.ts reads instead of parsing the
// YAML at each process start.
import { createHash, randomBytes } from 'node:crypto';
import fs from 'node:fs';
import path from 'node:path';
import { fileURLToPath } from 'node:url';
import { parse } from 'yaml';

const root = path.resolve(path.dirname(fileURLToPath(import.meta.url)), '..');
const text = fs.readFileSync(path.join(root, 'api', 'openapi.yaml'), 'utf8');
const out = path.join(root, 'dist', 'openapi.json');
fs.mkdirSync(path.dirname(out), { recursive: true });
// written whole under a name of this build's own, then renamed: a process starting meanwhile reads the old
// file or the new one, and two builds at once (two `npm start`s) do not take each other's file
const tmp = `${out}.${process.pid}.${randomBytes(4).toString('hex')}.tmp`;
fs.writeFileSync(tmp, JSON.stringify({ sha256: createHash('sha256').update(text).digest('hex'), document: parse(text) }));
fs.renameSync(tmp, out);
