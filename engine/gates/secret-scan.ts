// The built-in secret scan: secretlint's recommended rules over the gate's input files, in the
// service's process (it reads; it runs nothing of the workspace). What it finds is masked before it
// becomes an annotation, so a found secret never reaches a result, the ledger or a log.
import path from 'node:path';
import { lintSource } from '@secretlint/core';
import { secretLintProfiler } from '@secretlint/profiler';
import { creator as recommended } from '@secretlint/secretlint-rule-preset-recommend';
import { readInside } from './paths.js';
import { MAX_ANNOTATIONS, type Annotation } from './reports.js';

// secretlint 12's profiler records a performance mark per rule per file and scans every earlier one on
// each: O(n^2) in the files a process lints, and in the service's process it would grow for good. Nothing reads it;
// upstream makes it opt-in in 13 (secretlint#1673), which needs Node 22. Until then its marks are dropped.
secretLintProfiler.mark = () => {};

const MAX_FILE_BYTES = 1024 * 1024;
const CONFIG = { rules: [{ id: '@secretlint/secretlint-rule-preset-recommend', rule: recommended }] };

/**
 * What the scan found: every secret counted (`found`, `failed` when one is an error), the first
 * MAX_ANNOTATIONS kept as annotations (a file of 1 MB holds tens of thousands of tokens, and each
 * annotation was kept in the result, the ledger and every pack of it).
 */
export async function scanSecrets(workspace: string, files: string[]): Promise<{ annotations: Annotation[]; found: number; failed: boolean; scanned: number }> {
  const annotations: Annotation[] = [];
  let found = 0;
  let failed = false;
  let scanned = 0;
  for (const rel of files) {
    const content = await readInside(workspace, rel, MAX_FILE_BYTES);
    if (!content || content.subarray(0, 8192).includes(0)) continue; // not a plain file inside, too large, or binary
    const file = path.join(workspace, rel);
    scanned++;
    const result = await lintSource({
      source: { filePath: file, content: content.toString('utf8'), contentType: 'text' },
      options: { config: CONFIG, locale: 'en', maskSecrets: true },
    });
    for (const m of result.messages) {
      found++;
      if (m.severity === 'error') failed = true;
      if (annotations.length >= MAX_ANNOTATIONS) continue;
      annotations.push({
        path: rel,
        line: m.loc.start.line,
        level: m.severity === 'error' ? 'failure' : 'warning',
        title: m.ruleId,
        message: m.message,
      });
    }
  }
  return { annotations, found, failed, scanned };
}

/** The text with every secret the recommended rules find replaced by `***` (a gate's output, a report's message). */
export async function maskSecrets(text: string): Promise<string> {
  if (!text) return text;
  const result = await lintSource({
    source: { filePath: '/output.txt', content: text, contentType: 'text' },
    options: { config: CONFIG, locale: 'en', maskSecrets: true },
  });
  const ranges = result.messages.map((m) => m.range).sort((a, b) => b[0] - a[0]);
  let masked = text;
  for (const [start, end] of ranges) masked = `${masked.slice(0, start)}***${masked.slice(end)}`;
  return masked;
}
